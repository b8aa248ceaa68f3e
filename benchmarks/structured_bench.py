"""Structured output, every strategy side by side on the extraction set (issue 23's goals).

    python -m benchmarks.structured_bench TARGET --draft DRAFT [--threads 2] [--max-new-tokens 256]
        [--temperature 0.7 --seed 1] [--out FILE.json]

For each extraction item (benchmarks/data/extraction.jsonl: a chat prompt and its JSON schema), the
strategies take turns on the same Generator (greedy, jacobi, lookahead, speculative, auto), greedy
decoding then seeded sampling, each constrained by the item's schema. Per run: the tokens, whether
the output parses and validates (jsonschema), whether it equals constrained greedy's (the strategy
"greedy": one token a pass, every pick masked), decoding passes, tokens per pass, decode tokens/s,
the masks' seconds, and the guessed tokens sent past the grammar's forced runs. Prints a table per
sampling mode: all runs of a strategy summed.
"""

from __future__ import annotations

import json
import time

import click

STRATEGIES = ("greedy", "jacobi", "lookahead", "speculative", "auto")


@click.command()
@click.argument("target", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--draft", type=click.Path(exists=True, file_okay=False), default=None, help="A draft artifact (speculative, auto)."
)
@click.option(
    "--set",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A JSONL set like benchmarks/data/extraction.jsonl (default: the bundled one).",
)
@click.option("--threads", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1, 2048), default=256, show_default=True)
@click.option("--temperature", type=float, default=0.7, show_default=True, help="The seeded runs' temperature.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write every run as JSON here.")
def main(target, draft, path, threads, max_new_tokens, temperature, seed, out):
    import jsonschema  # noqa: F401  (needed: a missing package fails here, before the model loads)

    from benchmarks.extraction import extraction_set, follows_schema
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.constraints import Constraint

    # without the prefix cache: the strategies take turns on one prompt, and each should prefill alike
    gen = Generator.load(target, draft=draft, threads=threads, verify=False, prefix_cache=False)
    strategies = [s for s in STRATEGIES if draft or s != "speculative"]
    items = extraction_set(path)
    gen.generate("warm up", 8, constraint=Constraint.json_object())  # the grammar tokenizer, sessions
    runs = []
    for mode, sampling in (("greedy", {}), ("seeded", {"temperature": temperature, "seed": seed})):
        for item in items:
            constraint = Constraint.json_schema(item.schema)
            messages = [{"role": "user", "content": item.prompt}]
            for strategy in strategies:
                started = time.perf_counter()
                result = gen.generate(
                    messages=messages,
                    max_new_tokens=max_new_tokens,
                    strategy=strategy,
                    constraint=constraint,
                    **sampling,
                )
                wall = time.perf_counter() - started
                s = result.stats
                runs.append(
                    dict(
                        mode=mode,
                        item=item.id,
                        strategy=strategy,
                        ids=result.ids,
                        text=result.text,
                        valid=follows_schema(result.text, item.schema) if s.finish_reason == "eos" else False,
                        finish=s.finish_reason,
                        passes=s.target_passes,
                        accepted=round(s.tokens_per_pass * s.target_passes),
                        new_tokens=s.new_tokens,
                        decode_seconds=max(wall - s.prefill_seconds, 1e-9),
                        session_seconds=s.session_seconds,
                        prefill_seconds=s.prefill_seconds,
                        **s.constraint,
                    )
                )
            click.echo(
                f"{mode} {item.id}: "
                + ", ".join(
                    f"{r['strategy']} {r['accepted'] / max(r['passes'], 1):.2f}" for r in runs[-len(strategies) :]
                ),
                err=True,
            )
    for mode in ("greedy", "seeded"):
        _table(mode, [r for r in runs if r["mode"] == mode], strategies)
    if out:
        with open(out, "w") as f:
            json.dump(runs, f)


def _table(mode: str, runs: list[dict], strategies: list[str]) -> None:
    reference = {r["item"]: r["ids"] for r in runs if r["strategy"] == "greedy"}
    base = None
    click.echo(f"\n{mode}: {len(reference)} items\n")
    click.echo(
        "| strategy | valid | = constrained greedy | tokens | passes | tokens/pass | tokens/s | vs greedy | "
        "forced sent / committed | guessed past runs | mask ms/pass | mask / one-token pass |"
    )
    click.echo("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for strategy in strategies:
        mine = [r for r in runs if r["strategy"] == strategy]
        tokens = sum(r["new_tokens"] for r in mine)
        passes = sum(r["passes"] for r in mine)
        accepted = sum(r["accepted"] for r in mine)
        speed = sum(max(r["new_tokens"] - 1, 0) for r in mine) / sum(r["decode_seconds"] for r in mine)
        base = base or speed
        mask_ms = 1e3 * sum(r["mask_seconds"] for r in mine) / max(passes, 1)
        greedy = [r for r in runs if r["strategy"] == "greedy"]  # one-token passes: session time less the prefill
        one_pass_ms = (
            1e3
            * sum(r["session_seconds"] - r["prefill_seconds"] for r in greedy)
            / max(sum(r["passes"] for r in greedy), 1)
        )
        same = sum(r["ids"] == reference[r["item"]] for r in mine)
        click.echo(
            f"| {strategy} | {sum(r['valid'] for r in mine)}/{len(mine)} | {same}/{len(mine)} | {tokens} | {passes} | "
            f"{accepted / max(passes, 1):.2f} | {speed:.1f} | {speed / base:.2f}x | "
            f"{sum(r['forced_sent'] for r in mine)} / {sum(r['forced_committed'] for r in mine)} | "
            f"{sum(r.get('past_forced_sent', 0) for r in mine)} | {mask_ms:.2f} | "
            f"{100 * mask_ms / one_pass_ms:.1f}% |"
        )


if __name__ == "__main__":
    main()
