"""The benchmark behind `jacobi-rt bench`: every configuration over one prompt set, interleaved, and the report.

A *configuration* is anything that turns prompt token ids into new token ids and timings: a jacobi-rt
strategy on an artifact, or a peer (tools/peers.py). Each run gives one measurement record (a flat
dict, schema below); the report is arithmetic on those records only, so it is tested on
hand-made records. Runs are interleaved (for each repeat, for each prompt, for each configuration:
A B C A B C ...) so that machine drift hits every configuration alike.

Measurement record (schema_version 1):
    config, engine, prompt_id, category, repeat,
    ids (new tokens, an EOS that ended generation included), new_tokens, finish_reason,
    target_passes (decoding passes after the prefill; None when the engine does not say),
    tokens_per_pass, decode_tokens_per_second ((new - 1) / (wall - ttft)),
    ttft_seconds (prefill + the first token), wall_seconds,
    rss_before_mb, rss_peak_mb (this process, sampled every 5 ms during the run),
    accepted_per_pass (tokens committed by each decoding pass, or None), extra (engine counters)
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

SCHEMA_VERSION = 1
REFERENCE = "greedy"  # the jacobi-rt greedy configuration: identity and ratios are measured against it


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str
    chat: bool = True


def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file ({"id", "category", "prompt", "chat"} a line); default: the bundled set."""
    if path is None:
        from importlib.resources import files

        text = files("jacobi_rt.tools").joinpath("data/prompts.jsonl").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append(
                Prompt(
                    str(row["id"]), str(row.get("category", "other")), str(row["prompt"]), bool(row.get("chat", True))
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            from jacobi_rt.runtime.errors import InputError

            raise InputError(
                f'{path or "prompts.jsonl"} line {number}: expected a JSON object with "id" and "prompt" ({exc})'
            ) from exc
    return spread(prompts, limit) if limit else prompts


def spread(prompts: list[Prompt], limit: int) -> list[Prompt]:
    """The first `limit` prompts taken round-robin over the categories (so a short run still covers them all)."""
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    picked: list[Prompt] = []
    for rank in range(max(len(v) for v in by_category.values())):
        picked += [v[rank] for v in by_category.values() if rank < len(v)]
    return picked[:limit]


# -- one run ------------------------------------------------------------------------------------


@dataclass
class RunResult:
    ids: list[int]
    ttft_seconds: float
    wall_seconds: float
    target_passes: int | None = None
    finish_reason: str = ""
    accepted_per_pass: list[int] | None = None
    extra: dict = field(default_factory=dict)


class Config(Protocol):
    name: str  # unique in a run: "greedy", "jacobi", "hf", "ortgenai-ngram", ...
    engine: str  # what runs the model: configurations of one engine share its greedy baseline
    baseline: str | None  # the greedy configuration of the same engine (None: itself or none)

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult: ...


class RssSampler:
    """Peak resident memory of this process while a block runs (Linux /proc/self/statm, every 5 ms).

    The process is shared by every configuration (all models stay loaded), so the peak is the
    process's, and `before` tells what was resident already when the run began."""

    PAGE_MB = 4096 / 2**20

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.before = self.peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def current_mb(cls) -> float:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * cls.PAGE_MB
        except (OSError, ValueError, IndexError):
            import resource  # no /proc: the lifetime peak is the best there is

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.current_mb())

    def __enter__(self) -> RssSampler:
        self.before = self.peak = self.current_mb()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current_mb())


def measure(config: Config, prompt: Prompt, prompt_ids: list[int], repeat: int, max_new_tokens: int) -> dict:
    """Run one configuration on one prompt; return its measurement record."""
    with RssSampler() as rss:
        result = config.run(prompt_ids, max_new_tokens)
    new = len(result.ids)
    decode_seconds = max(result.wall_seconds - result.ttft_seconds, 1e-9)
    passes = result.target_passes
    return {
        "config": config.name,
        "engine": config.engine,
        "prompt_id": prompt.id,
        "category": prompt.category,
        "repeat": repeat,
        "ids": [int(t) for t in result.ids],
        "new_tokens": new,
        "finish_reason": result.finish_reason,
        "target_passes": passes,
        "tokens_per_pass": round((new - 1) / passes, 4) if passes else None,
        "decode_tokens_per_second": round(max(new - 1, 0) / decode_seconds, 3),
        "ttft_seconds": round(result.ttft_seconds, 5),
        "wall_seconds": round(result.wall_seconds, 5),
        "rss_before_mb": round(rss.before, 1),
        "rss_peak_mb": round(rss.peak, 1),
        "accepted_per_pass": result.accepted_per_pass,
        "extra": result.extra,
    }


def run_bench(
    configs: Sequence[Config],
    prompts: Sequence[Prompt],
    prompt_ids: dict[str, list[int]],
    max_new_tokens: int,
    repeats: int = 1,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Interleaved runs: for each repeat, for each prompt, for each configuration. One warm-up run each (discarded)."""
    if warmup and prompts:
        for config in configs:
            config.run(prompt_ids[prompts[0].id], min(8, max_new_tokens))
    records = []
    for repeat in range(repeats):
        for prompt in prompts:
            for config in configs:
                records.append(measure(config, prompt, prompt_ids[prompt.id], repeat, max_new_tokens))
                if progress:
                    progress(f"{config.name} {prompt.id}")
    return records


# -- jacobi-rt configurations ------------------------------------------------------------------


class _RecordingContext:
    """A backend context that notes how many window entries each commit keeps: after the prefill's
    chunks, one commit per decoding pass, keeping exactly the tokens that pass committed."""

    def __init__(self, inner, log: list[int]):
        self._inner, self._log = inner, log

    def commit_each(self, keeps: list[list[int]]) -> None:  # the engine's one commit a pass (one row here)
        self._log.append(len(keeps[0]))
        self._inner.commit_each(keeps)

    def __getattr__(self, name):  # forward, select, lengths, trim_row, ...
        return getattr(self._inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._inner.close()


class RecordingBackend:
    """Wraps a Generator's backend (runtime untouched) to get the accepted tokens of every pass."""

    def __init__(self, inner):
        self._inner = inner
        self.log: list[int] = []

    def context(self, capacity: int, batch: int = 1):
        self.log = []
        return _RecordingContext(self._inner.context(capacity, batch), self.log)

    def __getattr__(self, name):
        return getattr(self._inner, name)


# Bench names for a strategy with an option: NAME -> (strategy, Generator.generate() options)
VARIANTS: dict[str, tuple[str, dict]] = {
    "speculative-chain": ("speculative", {"jacobi_tail": False}),  # the draft's own chain each pass
    "speculative-tail": ("speculative", {"jacobi_tail": True}),  # target predictions seed the draft's next window
    "speculative-independent": (
        "speculative",
        {"coupled_draft": False},
    ),  # sampling: the draft's own noise, not the target's
}


def sampled(name: str, temperature: float) -> str:
    """The bench name of a configuration sampling at `temperature` ("lookahead@0.7"); 0 keeps the name."""
    return name if temperature == 0 else f"{name}@{temperature:g}"


def strategy_of(name: str) -> tuple[str, dict]:
    """(strategy, generate() options) of a bench strategy name: a strategy, or one of VARIANTS."""
    return VARIANTS.get(name, (name, {}))


class StrategyConfig:
    """A jacobi-rt strategy on a loaded Generator (whose backend is a RecordingBackend)."""

    def __init__(
        self,
        generator,
        strategy: str,
        window: int | None,
        name: str,
        engine: str,
        baseline: str | None,
        options: dict | None = None,
    ):
        self.generator, self.strategy, self.window = generator, strategy, window
        self.name, self.engine, self.baseline = name, engine, baseline
        self.options = options or {}

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunResult:
        result = self.generator.generate(
            prompt_ids, max_new_tokens=max_new_tokens, strategy=self.strategy, window=self.window, **self.options
        )
        s = result.stats
        log = getattr(self.generator.backend, "log", None)
        return RunResult(
            ids=result.ids,
            ttft_seconds=s.prefill_seconds,
            wall_seconds=s.wall_seconds,
            target_passes=s.target_passes,
            finish_reason=s.finish_reason,
            accepted_per_pass=list(log[s.prefill_passes :]) if log is not None else None,
            extra={
                "window": s.window,
                "adaptive": s.adaptive,
                "overhead_share": s.overhead_share,
                "proposer": s.proposer,
            },
        )


def load_generator(artifact: str | Path, draft: str | Path | None = None, threads: int | None = None, config=None):
    """Generator.load (config: its DecodingConfig) with the recording backend in place."""
    from jacobi_rt.runtime import Generator

    generator = Generator.load(
        artifact, draft=draft, threads=threads, config=config, prefix_cache=False
    )  # every configuration prefills alike
    generator.backend = RecordingBackend(generator.backend)
    return generator


def prompt_ids(generator, prompt: Prompt) -> list[int]:
    """The token ids every configuration is fed: the chat template applied by the artifact's tokenizer."""
    if prompt.chat:
        return generator.tokenizer.encode(
            generator.chat_prompt([{"role": "user", "content": prompt.prompt}]), add_special_tokens=False
        )
    return generator.tokenizer.encode(prompt.prompt)


def greedy_logit_gap(generator, prompt: list[int], prefix: list[int], chunk: int = 256) -> dict:
    """The greedy path's logits after prompt + prefix (one prefill with want_logits): top-2 gap there."""
    import numpy as np

    ids = list(prompt) + list(prefix)
    backend = getattr(generator.backend, "_inner", generator.backend)
    with backend.context(len(ids)) as ctx:
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk]
            out = ctx.forward(np.array([piece], dtype=np.int64), want_logits=start + chunk >= len(ids))
            ctx.commit(len(piece))
    logits = out.logits[0, -1]
    top = np.argsort(logits)[-2:][::-1]
    return {"top2_gap": round(float(logits[top[0]] - logits[top[1]]), 6), "top2_tokens": [int(t) for t in top]}


# -- identity against the reference -------------------------------------------------------------


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first new token where `other` differs from `reference` (a shorter one differs
    where it ends); None when they are identical."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def mark_identity(
    records: list[dict],
    reference: str = REFERENCE,
    logit_gap: Callable[[str, list[int]], dict] | None = None,
    references: dict[str, str] | None = None,
    other_gaps: dict[str, Callable[[str, list[int]], dict]] | None = None,
) -> None:
    """Add `identical` and `divergence` ({position, reference_token, token, top2_gap, ...}) to every record.

    references: config -> the greedy configuration it must equal, for configurations of another
    artifact (`--also`), which are exact against their own greedy; every other config is compared
    with `reference`. logit_gap(prompt_id, reference_ids_before_position) -> {"top2_gap": float, ...}:
    the reference greedy path's logits at the divergence position (cached per prompt and position);
    it is asked only for records compared with `reference`, and `other_gaps` (reference config ->
    the same function on that artifact) for records compared with another artifact's greedy."""
    references = references or {}
    gap_for = {reference: logit_gap, **(other_gaps or {})}
    greedy = {(r["config"], r["prompt_id"]): r["ids"] for r in records if r["repeat"] == 0}
    gaps: dict[tuple[str, str, int], dict] = {}
    for r in records:
        against = references.get(r["config"], reference)
        ref = greedy.get((against, r["prompt_id"]))
        if ref is None:
            r["identical"], r["divergence"] = None, None
            continue
        pos = first_divergence(ref, r["ids"])
        r["identical"] = pos is None
        if pos is None:
            r["divergence"] = None
            continue
        div = {
            "position": pos,
            "reference_token": ref[pos] if pos < len(ref) else None,
            "token": r["ids"][pos] if pos < len(r["ids"]) else None,
        }
        gap = gap_for.get(against)
        if gap is not None and div["reference_token"] is not None and div["token"] is not None:
            key = (against, r["prompt_id"], pos)
            if key not in gaps:
                gaps[key] = gap(r["prompt_id"], ref[:pos])
            div.update(gaps[key])
        r["divergence"] = div


# -- the report ---------------------------------------------------------------------------------


def quantiles(values: Sequence[float]) -> dict | None:
    """Median and interquartile spread: {"median", "p25", "p75", "n"} (None for no values)."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    if len(values) == 1:
        q = [values[0]] * 3
    else:
        q = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": round(q[1], 4), "p25": round(q[0], 4), "p75": round(q[2], 4), "n": len(values)}


def ratios(records: list[dict], config: str, baseline: str) -> list[float]:
    """Per prompt and repeat: tokens/s of `config` over tokens/s of `baseline` on the same prompt and repeat."""
    base = {(r["prompt_id"], r["repeat"]): r["decode_tokens_per_second"] for r in records if r["config"] == baseline}
    out = []
    for r in records:
        b = base.get((r["prompt_id"], r["repeat"]))
        if r["config"] == config and b:
            out.append(r["decode_tokens_per_second"] / b)
    return out


def summarise(records: list[dict], baselines: dict[str, str | None], reference: str = REFERENCE) -> dict:
    """Overall and per-prompt figures for every configuration (in first-seen order)."""
    names = list(dict.fromkeys(r["config"] for r in records))
    has_ref = any(r["config"] == reference for r in records)
    overall, per_prompt = {}, {}
    for name in names:
        rows = [r for r in records if r["config"] == name]
        own = baselines.get(name)
        divergent = [r["divergence"] for r in rows if r.get("divergence")]
        overall[name] = {
            "engine": rows[0]["engine"],
            "runs": len(rows),
            "tokens_per_pass": quantiles([r["tokens_per_pass"] for r in rows]),
            "decode_tokens_per_second": quantiles([r["decode_tokens_per_second"] for r in rows]),
            "ratio_vs_reference": quantiles(ratios(records, name, reference)) if has_ref else None,
            "ratio_vs_own_greedy": quantiles(ratios(records, name, own)) if own and own != name else None,
            "ttft_seconds": quantiles([r["ttft_seconds"] for r in rows]),
            "rss_peak_mb": max(r["rss_peak_mb"] for r in rows),
            "rss_added_mb": round(max(r["rss_peak_mb"] - r["rss_before_mb"] for r in rows), 1),
            "identical": sum(1 for r in rows if r.get("identical")),
            "compared": sum(1 for r in rows if r.get("identical") is not None),
            "first_divergence": min((d["position"] for d in divergent), default=None),
        }
        for prompt_id in dict.fromkeys(r["prompt_id"] for r in rows):
            mine = [r for r in rows if r["prompt_id"] == prompt_id]
            ratio = [x for x in ratios([r for r in records if r["prompt_id"] == prompt_id], name, reference)]
            div = next((r["divergence"] for r in mine if r.get("divergence")), None)
            per_prompt.setdefault(prompt_id, {"category": mine[0]["category"], "configs": {}})["configs"][name] = {
                "tokens_per_pass": quantiles([r["tokens_per_pass"] for r in mine]),
                "decode_tokens_per_second": quantiles([r["decode_tokens_per_second"] for r in mine]),
                "ratio_vs_reference": quantiles(ratio) if has_ref else None,
                "ttft_seconds": quantiles([r["ttft_seconds"] for r in mine]),
                "identical": all(r.get("identical") for r in mine) if mine[0].get("identical") is not None else None,
                "divergence": div,
            }
    return {"reference": reference if has_ref else None, "configs": overall, "prompts": per_prompt}


def report_json(summary: dict, records: list[dict], meta: dict) -> dict:
    """The JSON file's object: stable top-level keys, every raw measurement included."""
    return {"schema_version": SCHEMA_VERSION, "meta": meta, "summary": summary, "measurements": records}


def _q(q: dict | None, fmt: str = "{:.1f}", suffix: str = "") -> str:
    if not q:
        return "-"
    text = fmt.format(q["median"]) + suffix
    return text if q["n"] < 2 or q["p25"] == q["p75"] else f"{text} ({fmt.format(q['p25'])}-{fmt.format(q['p75'])})"


def markdown(summary: dict) -> str:
    """The overall table: medians with the p25-p75 spread in brackets."""
    lines = [
        (
            "| configuration | tokens/pass | tokens/s | vs jacobi-rt greedy | vs own greedy | TTFT ms | "
            "peak RSS MB (+run) | identical to greedy |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in summary["configs"].items():
        ttft = c["ttft_seconds"]
        ttft_ms = {k: v * 1000 if k != "n" else v for k, v in ttft.items()} if ttft else None
        if c["compared"]:
            ident = f"{c['identical']}/{c['compared']}"
            if c["first_divergence"] is not None:
                ident += f" (first diff at token {c['first_divergence']})"
        else:
            ident = "-"
        lines.append(
            f"| {name} | {_q(c['tokens_per_pass'], '{:.2f}')} | {_q(c['decode_tokens_per_second'])} "
            f"| {_q(c['ratio_vs_reference'], '{:.2f}', 'x')} | {_q(c['ratio_vs_own_greedy'], '{:.2f}', 'x')} "
            f"| {_q(ttft_ms, '{:.0f}')} | {c['rss_peak_mb']:.0f} (+{c['rss_added_mb']:.0f}) | {ident} |"
        )
    return "\n".join(lines)


def divergence_lines(summary: dict) -> list[str]:
    """One line per prompt and configuration that differs from greedy: where, and the top-2 logit gap there."""
    lines = []
    for prompt_id, p in summary["prompts"].items():
        for name, c in p["configs"].items():
            d = c["divergence"]
            if d:
                gap = f", greedy's top-2 logit gap there {d['top2_gap']:.4f}" if d.get("top2_gap") is not None else ""
                lines.append(
                    f"{name} on {prompt_id}: first different token at {d['position']} "
                    f"({d['token']} instead of {d['reference_token']}){gap}"
                )
    return lines


def write_outputs(out: Path, document: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
