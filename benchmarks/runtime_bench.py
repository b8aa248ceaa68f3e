"""Measure the runtime on one artifact: greedy vs Jacobi tokens/s and tokens per pass, the share
of wall time outside onnxruntime, one-pass time at W=1 with an empty vs a long cache, the peak
RSS of a `jacobi-rt generate` process, and the import time of jacobi_rt.runtime.

    python -m benchmarks.runtime_bench build/smollm2-135m --threads 2 --windows 2,4,8,auto --new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

PROMPTS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain what a hash table is and when to use one."}],
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    [{"role": "user", "content": "List the planets of the solar system with one fact about each."}],
    "The history of the Roman Empire began",
    "def quicksort(items):\n",
]


def run_strategy(gen, strategy: str, window: int | None, new_tokens: int) -> dict:
    ids, tokens, passes, wall, session, decode_wall = [], 0, 0, 0.0, 0.0, 0.0
    for prompt in PROMPTS:
        kwargs = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
        r = gen.generate(max_new_tokens=new_tokens, strategy=strategy, window=window, **kwargs)
        s = r.stats
        ids.append(r.ids)
        tokens += s.new_tokens - 1  # the prefill's token is not a decoding token
        passes += s.target_passes
        wall += s.wall_seconds
        session += s.session_seconds
        decode_wall += s.wall_seconds - s.prefill_seconds
    return {
        "strategy": strategy,
        "window": "auto" if strategy == "jacobi" and window is None else window or 1,
        "tokens_per_second": round(tokens / decode_wall, 2),
        "tokens_per_pass": round(tokens / passes, 3),
        "overhead_share": round((wall - session) / wall, 4),
        "ids": ids,
    }


def pass_time(gen, past: int, repeats: int = 15) -> float:
    """Median ms of one W=1 pass after `past` cached entries."""
    with gen.backend.context(past + 1) as ctx:
        for start in range(0, past, 256):
            n = min(256, past - start)
            ctx.forward(np.arange(start, start + n, dtype=np.int64)[None] % 1000 + 10)
            ctx.commit(n)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            ctx.forward(np.array([[42]], dtype=np.int64))
            times.append(time.perf_counter() - t)
            ctx.commit(0)
    return round(1000 * statistics.median(times), 2)


def import_seconds() -> float:
    code = "import time; t = time.perf_counter(); import jacobi_rt.runtime; print(time.perf_counter() - t)"
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout)
        for _ in range(3)
    ]
    return round(min(runs), 3)


def peak_rss_mb(artifact: str, threads: int) -> float:
    code = (
        "import sys, resource; from jacobi_rt.runtime import Generator; "
        f"g = Generator.load({artifact!r}, threads={threads}); "
        "g.generate('Tell me about the sea.', chat=True, max_new_tokens=64); "
        # VmHWM, not ru_maxrss: on Linux a child's ru_maxrss starts from its parent's peak
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    return round(int(out.stdout.strip()) / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--windows", default="2,4,8,auto", help="Jacobi windows to run; auto: the adaptive default")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args()

    from pathlib import Path

    from jacobi_rt.runtime import Generator

    args.artifact = str(Path(args.artifact).resolve())

    report = {"import_seconds": import_seconds()}
    started = time.perf_counter()
    gen = Generator.load(args.artifact, threads=args.threads, prefix_cache=False)
    report["load_seconds"] = round(time.perf_counter() - started, 2)
    report["threads"] = gen.backend.threads
    report["pass_ms_w1_past0"] = pass_time(gen, 0)
    report["pass_ms_w1_past1024"] = pass_time(gen, 1024)
    greedy = run_strategy(gen, "greedy", None, args.new_tokens)
    print(f"passes: {report}", file=sys.stderr, flush=True)
    runs = [greedy]
    for w in args.windows.split(","):
        runs.append(run_strategy(gen, "jacobi", None if w == "auto" else int(w), args.new_tokens))
        print({k: v for k, v in runs[-1].items() if k != "ids"}, file=sys.stderr, flush=True)
    for r in runs:
        r["identical_to_greedy"] = r.pop("ids") == greedy["ids"] if r is not greedy else True
        r["speedup_vs_greedy"] = round(r["tokens_per_second"] / greedy["tokens_per_second"], 3)
    greedy.pop("ids", None)
    report["runs"] = runs
    if not args.skip_rss:
        report["peak_rss_mb_generate_process"] = peak_rss_mb(args.artifact, gen.backend.threads)
    report["bench_process_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
