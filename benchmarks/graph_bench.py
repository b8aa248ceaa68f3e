"""Greedy on the portable and the in-place graph of one artifact, side by side: tokens/s and identity.

    python -m benchmarks.graph_bench build/smollm2-135m --prompts 12 --new-tokens 128 --threads 2

Both graphs are loaded at once and each prompt runs on them in turn (the order alternating), so
machine noise hits both alike. Where the two greedy outputs differ, the first differing position
is reported with the portable graph's top-2 logit gap there (a numerical near-tie when it is tiny).
A tool, not a test.
"""

from __future__ import annotations

import statistics

import click
import numpy as np


def top2_gap(gen, ids: list[int]) -> float:
    """The portable graph's top-2 logit gap at the last of `ids` (one prefill pass)."""
    with gen.backend.context(len(ids) + 1) as ctx:
        out = ctx.forward(np.array([ids], dtype=np.int64), want_logits=True)
    top = np.sort(out.logits[0, -1])[-2:]
    return float(top[1] - top[0])


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--prompts", "limit", type=int, default=12, show_default=True, help="How many of the bundled bench prompts."
)
@click.option("--new-tokens", type=int, default=128, show_default=True)
@click.option("--threads", type=int, default=None, help="Default: the physical cores.")
@click.option("--strategy", default="greedy", show_default=True)
def main(artifact, limit, new_tokens, threads, strategy):
    """Tokens/s of one strategy on both graph variants, and whether their outputs are identical."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.tools.bench import load_prompts

    gens = {g: Generator.load(artifact, threads=threads, graph=g, prefix_cache=False) for g in ("portable", "inplace")}
    rates: dict[str, list[float]] = {g: [] for g in gens}
    identical = 0
    prompts = load_prompts(limit=limit)
    for i, p in enumerate(prompts):
        order = list(gens) if i % 2 == 0 else list(gens)[::-1]
        gen = gens["portable"]
        if p.chat:
            prompt_ids = gen.tokenizer.encode(
                gen.chat_prompt([{"role": "user", "content": p.prompt}]), add_special_tokens=False
            )
        else:
            prompt_ids = gen.tokenizer.encode(p.prompt)
        results = {}
        for g in order:
            results[g] = gens[g].generate(prompt_ids, max_new_tokens=new_tokens, strategy=strategy)
            stats = results[g].stats
            rates[g].append(stats.new_tokens / stats.wall_seconds)
        a, b = results["portable"].ids, results["inplace"].ids
        if a == b:
            identical += 1
            note = "identical"
        else:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            gap = top2_gap(gen, prompt_ids + a[:at])
            note = (
                f"differ at new token {at} ({a[at] if at < len(a) else None} vs {b[at] if at < len(b) else None}), "
                f"portable top-2 gap {gap:.2e}"
            )
        print(
            f"{p.id}: portable {rates['portable'][-1]:.1f} tok/s, inplace {rates['inplace'][-1]:.1f} tok/s, {note}",
            flush=True,
        )
    med = {g: statistics.median(r) for g, r in rates.items()}
    print(f"\n| graph | {strategy} tokens/s (median of {len(prompts)}) | ratio |")
    print("|---|---|---|")
    for g in gens:
        print(f"| {g} | {med[g]:.1f} | {med[g] / med['portable']:.2f}x |")
    print(f"identical outputs: {identical}/{len(prompts)}")


if __name__ == "__main__":
    main()
