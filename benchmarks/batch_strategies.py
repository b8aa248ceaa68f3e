"""Rows of each strategy in one batch: total tokens/s on the batcher, the strategies taking turns.

N chat prompts run together on a batcher of N slots, all rows greedy, then all speculative (or any
strategies), round after round with the order swapped, so a noisy machine hits each alike. Per
strategy: total new tokens / wall seconds, tokens per pass, and for drafting rows how much the draft
proposed (a row the allocator keeps greedy sends no draft tokens: `draft passes`, `proposed`).
`speculative:3` offers a fixed 3 draft tokens a pass (config draft.length; the batch's width still
decides whether they are sent). `--draft-modes batched,own` runs each drafting strategy twice: its rows' drafts in one
batched pass a step (the batcher's draft slots) and each row's draft on its own.

    python -m benchmarks.batch_strategies build/smollm2-135m --draft build/smollm2-135m-int8 \\
        --strategies greedy,speculative,speculative:2 --draft-modes batched,own --rows 8 --rounds 2
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click

from .ab_bench import TOPICS


def draft_counts(proposer_stats: dict) -> tuple[int, int]:
    """(draft passes, draft tokens proposed) in a row's proposer stats, wherever the draft sits (speculative, auto)."""
    if "draft_passes" in proposer_stats:
        return proposer_stats["draft_passes"], proposer_stats["proposed"]
    passes = proposed = 0
    for value in proposer_stats.values():
        if isinstance(value, dict):
            p, n = draft_counts(value)
            passes, proposed = passes + p, proposed + n
    return passes, proposed


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--draft", type=click.Path(exists=True, file_okay=False), default=None)
@click.option("--strategies", default="greedy,speculative", show_default=True)
@click.option("--rows", type=click.IntRange(1, 16), default=8, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--draft-modes",
    default="batched",
    show_default=True,
    help="batched (one draft pass a step for all rows), own (each row's draft alone), or both",
)
@click.option(
    "--config",
    "config",
    default=None,
    help="DecodingConfig fields for every strategy, as JSON "
    "(e.g. '{\"draft.prior_cost\": 0}': a draft priced free until its passes are timed)",
)
@click.option("--out", type=click.Path(dir_okay=False), default=None)
def main(artifact, draft, strategies, rows, rounds, max_tokens, draft_modes, config, out):
    """Total tokens/s of a batch of rows per strategy, side by side."""
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact, draft=draft, verify=False, prefix_cache=False)
    prompts = [
        gen.tokenizer.encode(
            gen.chat_prompt([{"role": "user", "content": f"Tell me about {t}."}]), add_special_tokens=False
        )
        for t in TOPICS[:rows]
    ]
    modes = draft_modes.split(",")
    names = [
        f"{s} {m}" if s.split(":")[0] in ("speculative", "auto") and len(modes) > 1 else s
        for s in strategies.split(",")
        for m in modes
    ]
    names = list(dict.fromkeys(names))  # a strategy without a draft runs once
    runs: dict[str, list[dict]] = {name: [] for name in names}
    outputs: dict[str, list[list[int]]] = {}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            strategy, _, mode = name.partition(" ")
            strategy, _, k = strategy.partition(":")
            gen.start_batching(rows, batched_draft=(mode or modes[0]) == "batched")
            try:
                started = time.perf_counter()
                overrides = {**json.loads(config or "{}"), **({"draft.length": int(k)} if k else {})}
                results = gen.generate_batch(
                    prompts, max_new_tokens=max_tokens, strategy=strategy, config=overrides or None
                )
                wall = time.perf_counter() - started
            finally:
                gen.stop_batching()
            outputs[name] = [r.ids for r in results]
            drafts = [draft_counts(r.stats.proposer) for r in results]
            runs[name].append(
                {
                    "tokens_per_second": sum(r.stats.new_tokens for r in results) / wall,
                    "tokens_per_pass": statistics.mean(r.stats.tokens_per_pass for r in results),
                    "draft_passes": sum(d[0] for d in drafts),
                    "proposed": sum(d[1] for d in drafts),
                    "rows_without_draft": sum(1 for d in drafts if d[1] == 0),
                }
            )
            click.echo(f"round {round_ + 1} {name}: {runs[name][-1]}", err=True)
    table = {name: {key: statistics.mean(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    table["identical"] = all(outputs[name] == outputs[names[0]] for name in names)
    click.echo(json.dumps(table, indent=2))
    if out:
        Path(out).write_text(json.dumps({"runs": runs, "table": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
