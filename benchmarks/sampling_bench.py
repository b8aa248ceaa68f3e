"""What sampling adds to a pass: bringing the logits to the host, and choosing each window row's token.

    python -m benchmarks.sampling_bench build/smollm2-135m [--past 256] [--repeats 30]

Prints, for windows of 1, 8 and 16 tokens after `past` cached tokens: the pass with greedy ids
only and with the logits too (the difference is what fetching logits costs), and the sampler's
time per row on that pass's real logits for several settings, plus the Gumbel noise alone over
the whole vocabulary and over 50 survivors (noise keyed by (seed, position, token) lets a pass
draw it for the survivors only). Medians of `repeats` runs; the machine's load shows in them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SETTINGS = {
    "greedy (argmax of penalised logits)": dict(temperature=0.0, repetition_penalty=1.1),
    "T=0.3": dict(temperature=0.3),
    "T=0.7": dict(temperature=0.7),
    "T=1.0": dict(temperature=1.0),
    "T=0.7 top_p=0.9": dict(temperature=0.7, top_p=0.9),
    "T=0.7 top_k=50": dict(temperature=0.7, top_k=50),
    "T=0.7 min_p=0.05": dict(temperature=0.7, min_p=0.05),
    "T=0.7 repetition_penalty=1.2": dict(temperature=0.7, repetition_penalty=1.2),
}


def median_ms(fn, repeats: int, *args) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def pass_costs(generator, past: int, windows: list[int], repeats: int) -> tuple[list[str], np.ndarray]:
    """Lines for the pass timings; the logits of the last window (rows to sample from)."""
    lines, logits = [], None
    with generator.backend.context(past + max(windows) + 1) as ctx:
        prompt = np.arange(past, dtype=np.int64)[None] % 1000 + 10
        ctx.forward(prompt)
        ctx.commit(past)
        for w in windows:
            ids = np.full((1, w), 42, dtype=np.int64)

            def run(ids: np.ndarray, want: bool):
                out = ctx.forward(ids, want_logits=want)
                ctx.commit(0)
                return out

            plain, with_logits = median_ms(run, repeats, ids, False), median_ms(run, repeats, ids, True)
            lines.append(f"| {w} | {plain:.2f} | {with_logits:.2f} | {with_logits - plain:+.2f} |")
            logits = run(ids, True).logits[0]
    return lines, logits


def _sample_once(sampler, logits: np.ndarray, prefix: list[int], rows) -> None:
    """One draw, each from the next row of logits at the next position: nothing is cached across draws."""
    sampler.sample(logits[next(rows) % len(logits)], prefix, 300 + next(rows))


def sampler_costs(logits: np.ndarray, repeats: int) -> list[str]:
    from jacobi_rt.runtime.sampling import Sampler, SamplingParams, gumbel

    prefix = list(range(100, 400))
    lines = []
    for label, params in SETTINGS.items():
        sampler = Sampler(SamplingParams(seed=1, **params), prompt_len=200)
        rows = iter(range(10**9))
        ms = median_ms(_sample_once, repeats, sampler, logits, prefix, rows)
        lines.append(f"| {label} | {ms:.3f} |")
    vocab = np.arange(logits.shape[-1])
    few = np.sort(np.random.default_rng(0).choice(logits.shape[-1], 50, replace=False))
    lines.append(
        f"| noise alone, whole vocabulary ({logits.shape[-1]}) | "
        f"{median_ms(lambda: gumbel(1, 7, vocab), repeats):.3f} |"
    )
    lines.append(f"| noise alone, 50 survivors | {median_ms(lambda: gumbel(1, 7, few), repeats):.3f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--past", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    from jacobi_rt.runtime import Generator

    generator = Generator.load(args.artifact, threads=args.threads, verify=False, prefix_cache=False)
    lines, logits = pass_costs(generator, args.past, [1, 8, 16], args.repeats)
    print(f"One pass after {args.past} cached tokens, median ms of {args.repeats}:\n")
    print("| window | greedy ids only | + logits to host | logits cost |\n|---|---|---|---|")
    print("\n".join(lines))
    print("\nChoosing one row's token on real logits (ms per row; a pass samples every window row):\n")
    print("| setting | ms per row |\n|---|---|")
    print("\n".join(sampler_costs(logits, args.repeats * 3)))


if __name__ == "__main__":
    main()
