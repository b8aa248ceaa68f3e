"""Time one window pass of an artifact's graph(s) at several window and past lengths.

    python -m jacobi_rt.tools.pass_bench build/smollm2-135m --windows 1,4,8,16 --pasts 0,256,1024

Inputs are bound once as OrtValues (IO binding), so the figure is the graph's own cost on
this machine: compute plus the in-graph past->present copy. A tool, not a test.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click
import numpy as np


def time_pass(session, layers: int, kv_heads: int, head_dim: int, dtype, window: int, past: int, repeats: int) -> float:
    import onnxruntime as ort

    feeds = {
        "input_ids": np.full((1, window), 7, dtype=np.int64),
        "position_ids": np.arange(past, past + window, dtype=np.int64)[None],
        "attention_mask": np.ones((1, past + window), dtype=np.int64),
        "window_mask": np.tril(np.ones((window, window), dtype=bool))[None],
    }
    kv = np.random.default_rng(0).standard_normal((1, kv_heads, past, head_dim)).astype(dtype)
    for i in range(layers):
        feeds[f"past_key_values.{i}.key"] = kv
        feeds[f"past_key_values.{i}.value"] = kv
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
    for out in session.get_outputs():
        if out.name != "logits":
            binding.bind_output(out.name, "cpu")
    binding.bind_output("logits", "cpu")
    session.run_with_iobinding(binding)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--windows", default="1,4,8,16", show_default=True)
@click.option("--pasts", default="0,256,1024", show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=10, show_default=True)
@click.option("--graph", "graphs", multiple=True, help="Graph file(s) in the artifact; default: every variant in the manifest.")
def main(artifact, windows, pasts, threads, repeats, graphs):
    """Median milliseconds per window pass, per graph variant, window and past length."""
    import onnxruntime as ort

    from jacobi_rt.runtime.manifest import read_manifest

    manifest = read_manifest(artifact)
    arch = manifest.architecture
    dtype = np.float16 if manifest.dtype == "float16" else np.float32
    files = graphs or sorted(set(manifest.graphs.values()))
    ws = [int(w) for w in windows.split(",")]
    ps = [int(p) for p in pasts.split(",")]
    print("| graph | past | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|---|" + "---|" * len(ws))
    for name in files:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(Path(artifact) / name), options, providers=["CPUExecutionProvider"])
        for past in ps:
            cells = [time_pass(session, arch.num_layers, arch.kv_heads, arch.head_dim, dtype, w, past, repeats) for w in ws]
            print(f"| {name} | {past} | " + " | ".join(f"{c:.1f} ms" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
