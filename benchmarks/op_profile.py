"""Where one pass's time goes, by operator type: onnxruntime's own profiler over a bare session.

    python -m benchmarks.op_profile build/smollm2-135m-gguf --graph portable --window 1 --past 256
    python -m benchmarks.op_profile build/ortgenai-int4        # an onnxruntime-genai model folder

ARTIFACT is a jacobi-rt artifact (its manifest names the graph files) or any folder holding a
`model.onnx` whose inputs follow onnxruntime-genai's names (input_ids, attention_mask,
past_key_values.N.key/value). The session gets the runtime's options (ORT_ENABLE_ALL, sequential,
`--threads` intra-op threads); inputs are zeros except the ids (7), positions, masks (all ones, a
causal window) and the in-place graph's `cache_lengths` (= past, capacity past + window). The
first `--warmup` runs are dropped; the table sums the kernels of the next `--runs` runs per
operator type (onnxruntime's fused names: MatMulNBits, SkipSimplifiedLayerNormalization ...), per
pass: total milliseconds, share, node count. A tool, not a test: timings on a shared machine are
noisy, compare artifacts within one run.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np


@dataclass
class OpRow:
    op: str
    ms: float  # per pass
    nodes: float  # kernels per pass


@dataclass
class Profile:
    name: str
    pass_ms: float  # onnxruntime's model_run time per pass
    rows: list[OpRow] = field(default_factory=list)

    @property
    def kernel_ms(self) -> float:
        return sum(r.ms for r in self.rows)

    @property
    def nodes(self) -> int:
        return round(sum(r.nodes for r in self.rows))


def graph_file(folder: Path, graph: str) -> tuple[Path, dict[str, int]]:
    """The ONNX file to profile and the sizes of the model's symbolic axes it needs beyond the pass's own."""
    manifest = folder / "jacobi.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        arch = m["architecture"]
        if graph not in m["graphs"]:
            raise click.UsageError(f"{folder} has no {graph!r} graph (it has {sorted(m['graphs'])})")
        return folder / m["graphs"][graph], {"head_dim": arch["head_dim"], "kv_heads": arch["kv_heads"]}
    config = folder / "genai_config.json"
    if not (folder / "model.onnx").is_file():
        raise click.UsageError(f"{folder} holds neither a jacobi.json nor a model.onnx")
    sizes = {}
    if config.is_file():
        decoder = json.loads(config.read_text())["model"]["decoder"]
        sizes = {"kv_cache_dim": decoder["head_size"], "head_dim": decoder["head_size"]}
    return folder / "model.onnx", sizes


def feeds(session, window: int, past: int, sizes: dict[str, int], rows: int = 1) -> dict[str, np.ndarray]:
    """One pass's inputs by name and symbolic axis (jacobi-rt's and onnxruntime-genai's names), `rows` batch rows."""
    total = past + window
    axes = {
        "batch": rows,
        "batch_size": rows,
        "window": window,
        "sequence_length": window,
        "past": past,
        "past_sequence_length": past,
        "total": total,
        "total_sequence_length": total,
        "capacity": total,
        **sizes,
    }
    dtypes = {
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
        "tensor(bool)": np.bool_,
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
    }
    out = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else axes[d] for d in i.shape]
        dtype = dtypes[i.type]
        if i.name == "input_ids":
            out[i.name] = np.full(shape, 7, dtype)
        elif i.name == "position_ids":
            out[i.name] = np.broadcast_to(np.arange(past, total, dtype=dtype), shape).copy()
        elif i.name == "attention_mask":
            out[i.name] = np.ones(shape, dtype)
        elif i.name == "window_mask":
            out[i.name] = np.broadcast_to(np.tril(np.ones((window, window), dtype)), shape).copy()
        elif i.name == "cache_lengths":
            out[i.name] = np.full(shape, past, dtype)
        else:
            out[i.name] = np.zeros(shape, dtype)
    return out


def profile(
    folder: Path,
    graph: str = "portable",
    window: int = 1,
    past: int = 256,
    threads: int = 1,
    warmup: int = 10,
    runs: int = 50,
    name: str | None = None,
    rows: int = 1,
) -> Profile:
    import onnxruntime as ort

    from jacobi_rt.runtime.backends.ort_session import session_options

    path, sizes = graph_file(folder, graph)
    options = session_options(ort, threads)
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        inputs = feeds(session, window, past, sizes, rows)
        for _ in range(warmup + runs):
            session.run(["logits"], inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    return summarise(events, warmup, runs, name or f"{folder.name}/{graph}")


def summarise(events: list[dict], warmup: int, runs: int, name: str) -> Profile:
    """Kernel time and count per op type over the runs after the warm-up ones (onnxruntime's trace events)."""
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    kept = model_runs[warmup : warmup + runs]
    start, end = kept[0]["ts"], kept[-1]["ts"] + kept[-1]["dur"]
    ms, count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and start <= e["ts"] <= end:
            op = e.get("args", {}).get("op_name", "?")
            ms[op] += e["dur"] / 1000
            count[op] += 1
    rows = sorted((OpRow(op, ms[op] / len(kept), count[op] / len(kept)) for op in ms), key=lambda r: -r.ms)
    return Profile(name, sum(r["dur"] for r in kept) / 1000 / len(kept), rows)


def table(profiles: list[Profile]) -> str:
    """One markdown table: op type rows, per profile ms per pass and nodes, ordered by the first profile's time."""
    ops: list[str] = []
    for p in profiles:
        ops += [r.op for r in p.rows if r.op not in ops]
    by = [{r.op: r for r in p.rows} for p in profiles]
    head = "| op type | " + " | ".join(f"{p.name} ms | nodes" for p in profiles) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(profiles)]
    for op in ops:
        cells = [f"{b[op].ms:.2f} | {b[op].nodes:.0f}" if op in b else "- | -" for b in by]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines.append("| all kernels | " + " | ".join(f"{p.kernel_ms:.2f} | {p.nodes}" for p in profiles) + " |")
    lines.append("| model_run | " + " | ".join(f"{p.pass_ms:.2f} | " for p in profiles) + " |")
    return "\n".join(lines)


@click.command()
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--graph", default="portable", show_default=True, help="jacobi-rt artifacts' graph variant (portable, inplace)."
)
@click.option("--window", type=click.IntRange(1), default=1, show_default=True)
@click.option("--past", type=click.IntRange(0), default=256, show_default=True)
@click.option(
    "--rows", type=click.IntRange(1), default=1, show_default=True, help="Batch rows, each with the same past."
)
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True)
@click.option("--warmup", type=click.IntRange(1), default=10, show_default=True)
@click.option("--runs", type=click.IntRange(1), default=50, show_default=True)
def main(folders, graph, window, past, rows, threads, warmup, runs):
    """Per-op-type kernel milliseconds and node counts of one pass, for each artifact or model folder."""
    profiles = [profile(f, graph, window, past, threads, warmup, runs, rows=rows) for f in folders]
    print(
        f"W={window}, rows {rows}, past {past}, {threads} thread(s), "
        f"mean of {runs} runs after {warmup} warm-up (ms per pass)"
    )
    print(table(profiles))


if __name__ == "__main__":
    main()
