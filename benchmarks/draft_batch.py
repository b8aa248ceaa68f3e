"""Speculative rows of one batch made to draft K tokens every pass: the drafts batched (the batcher's draft
slots) against each row's draft on its own, and greedy rows, taking turns.

The allocator would send these rows to greedy on a CPU where the draft costs too much (that is
benchmarks/batch_strategies.py's measurement); here a flat, fixed pass-cost curve and a draft priced free make
every row send its K guesses, so what drafting in a batch really costs shows: total new tokens / wall
seconds, tokens per row pass, and the draft's seconds per pass. Every row's output must equal greedy's.

    python -m benchmarks.draft_batch build/smollm2-135m --draft build/smollm2-135m-int8 --ks 1,2,3 --rows 8
"""

from __future__ import annotations

import json
import statistics
import time

import click

from .ab_bench import TOPICS


def run(gen, prompts, k: int, slotted: bool, max_tokens: int) -> dict:
    """One batch: k = 0 greedy rows, else speculative rows sending k draft tokens a pass."""
    from jacobi_rt.runtime.acceptance import PassCosts
    from jacobi_rt.runtime.batcher import Batcher
    from jacobi_rt.runtime.config import CostConfig, DraftConfig
    from jacobi_rt.runtime.draft import DraftProposer
    from jacobi_rt.runtime.draft_length import DraftLength
    from jacobi_rt.runtime.pass_budget import PassBudget
    from jacobi_rt.runtime.proposers import NoProposer
    from jacobi_rt.runtime.row import END, Row
    from jacobi_rt.runtime.sampling import Sampler, SamplingParams

    flat = {1: 1.0, 4096: 1.0}
    budget = PassBudget(prefill_tokens=256, costs=PassCosts(CostConfig(flat, learn=False, batch_pass_costs=flat)))
    capacity = max(len(p) for p in prompts) + max_tokens + 16
    batcher = Batcher.open(gen.backend, len(prompts), capacity, budget=budget, draft=gen.draft if slotted else None)

    def proposer():
        if not k:
            return NoProposer()
        length = DraftLength(PassCosts(CostConfig(flat, learn=False)), DraftConfig(prior_cost=0.0))
        return DraftProposer(gen.draft, capacity, DraftConfig(length=k), length=length)

    eos = set(gen.manifest.tokens.eos_ids)
    rows = [
        Row(list(p), max_tokens, proposer(), Sampler(SamplingParams(), len(p)), k + 1, eos, capacity) for p in prompts
    ]
    started = time.perf_counter()
    for row in rows:
        batcher.submit(row)
    while not all(row.finished and row.slot < 0 for row in rows):
        batcher.step()
    wall = time.perf_counter() - started
    batcher.close()
    outputs = []
    for row in rows:
        out = []
        while (batch := row.tokens.get_nowait()) is not END:
            out += batch
        outputs.append(out)
    stats = [row.proposer.stats for row in rows]
    passes = sum(row.progress.target_passes for row in rows)
    draft_seconds = sum(s.get("draft_seconds", 0.0) for s in stats)
    return {
        "tokens_per_second": sum(len(o) for o in outputs) / wall,
        "tokens_per_row_pass": sum(row.progress.accepted for row in rows) / max(1, passes),
        "draft_share": draft_seconds / wall,
        "outputs": outputs,
    }


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--draft", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--ks", default="1,2,3", show_default=True, help="draft tokens a pass, comma-separated")
@click.option("--rows", type=click.IntRange(2, 16), default=8, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
def main(artifact, draft, ks, rows, rounds, max_tokens):
    """Total tokens/s of a batch of speculative rows, drafts batched and alone, and of greedy rows."""
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact, draft=draft, verify=False, prefix_cache=False)
    prompts = [
        gen.tokenizer.encode(
            gen.chat_prompt([{"role": "user", "content": f"Tell me about {t}."}]), add_special_tokens=False
        )
        for t in TOPICS[:rows]
    ]
    names = ["greedy"] + [f"k={k} {mode}" for k in map(int, ks.split(",")) for mode in ("batched", "own")]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            k = 0 if name == "greedy" else int(name.split()[0][2:])
            runs[name].append(run(gen, prompts, k, name.endswith("batched"), max_tokens))
            click.echo(
                f"round {round_ + 1} {name}: "
                + json.dumps({key: round(v, 3) for key, v in runs[name][-1].items() if key != "outputs"}),
                err=True,
            )
    table = {
        name: {key: round(statistics.mean(r[key] for r in rs), 3) for key in rs[0] if key != "outputs"}
        for name, rs in runs.items()
    }
    table["identical"] = all(r["outputs"] == runs["greedy"][0]["outputs"] for rs in runs.values() for r in rs)
    click.echo(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
