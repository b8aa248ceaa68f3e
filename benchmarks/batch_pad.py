"""Greedy rows side by side with and without a pad column on their width-one passes.

In the `padded` exactness mode (runtime/backends/exact_rows.py) a one-token pass runs as two tokens so that no
kernel runs one row. Greedy rows on a batcher make width-one passes of many rows; where the graph's attention has
its extra row (exporter/attention/gqa_rows.py) no kernel runs one row there, so the runtime runs them as they come.
This runs N chat prompts greedy on a batcher of N slots per artifact, both ways in alternating rounds (`padded`:
what a graph without the row runs, every width-one pass padded: a second load of the artifact with `pad_rows` set
before its first context, `needs_pad` wrapped while it runs), plus each prompt alone; it reports total new tokens/s
(medians), the median of the rounds' runtime/padded ratios, and whether every batched output equals the prompt's
lone greedy output.

    python -m benchmarks.batch_pad build/smollm2-135m-int4 build/smollm2-135m --rows 16 --rounds 3
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click

from .ab_bench import TOPICS


@click.command()
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--rows", type=click.IntRange(2, 16), default=16, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="also write the rows as JSON here")
def main(artifacts, rows, rounds, max_tokens, out):
    """Batched greedy tokens/s with width-one passes padded (the rule before) and as the runtime runs them."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.backends import ort_binding

    runs_as_they_come = ort_binding.needs_pad
    table = []
    for artifact in artifacts:
        gen = Generator.load(artifact, verify=False, prefix_cache=False)
        padded = Generator.load(artifact, verify=False, prefix_cache=False)
        padded.backend.pad_rows = True  # before any context: its buffers take the pad's spare entry
        prompts = [f"Tell me about {topic}." for topic in (TOPICS * 2)[:rows]]
        lone = [gen.generate(p, max_new_tokens=max_tokens, chat=True, strategy="greedy").ids for p in prompts]
        arms = {
            "padded": (padded, lambda r, w, extra_row=False: runs_as_they_come(r, w, extra_row=False)),
            "runtime": (gen, runs_as_they_come),
        }
        speeds = {arm: [] for arm in arms}
        same = {arm: True for arm in arms}
        for round_ in range(rounds):
            for arm in arms if round_ % 2 == 0 else list(reversed(arms)):
                runner, ort_binding.needs_pad = arms[arm]
                try:
                    started = time.perf_counter()
                    results = runner.generate_batch(prompts, max_new_tokens=max_tokens, chat=True, strategy="greedy")
                    wall = time.perf_counter() - started
                finally:
                    ort_binding.needs_pad = runs_as_they_come
                speeds[arm].append(sum(r.stats.new_tokens for r in results) / wall)
                same[arm] &= [r.ids for r in results] == lone
        row = {
            "artifact": Path(artifact).name,
            "mode": gen.exactness,
            "extra_row": bool(getattr(gen.backend, "extra_row", False)),
            **{f"{arm}_tok_s": round(statistics.median(v), 1) for arm, v in speeds.items()},
            # each round runs the two arms back to back: the median of their ratios survives a load that changes
            # between rounds, where a ratio of medians does not
            "ratio": round(statistics.median(b / a for a, b in zip(speeds["padded"], speeds["runtime"])), 2),
            "identical_to_lone_greedy": all(same.values()),
            "rounds": {arm: [round(s, 1) for s in v] for arm, v in speeds.items()},
        }
        table.append(row)
        del gen, padded
        click.echo(json.dumps(row), err=True)
    click.echo(
        "| artifact | mode | extra row | padded tok/s | runtime tok/s | ratio (paired) | identical to lone greedy |"
    )
    click.echo("|---|---|---|---|---|---|---|")
    for r in table:
        click.echo(
            f"| {r['artifact']} | {r['mode']} | {r['extra_row']} | {r['padded_tok_s']} | {r['runtime_tok_s']} | "
            f"{r['ratio']}x | {r['identical_to_lone_greedy']} |"
        )
    if out:
        Path(out).write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
