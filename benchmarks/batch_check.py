"""Does batching change the output? Each bench prompt's greedy tokens, generated alone and in batches.

A batched pass multiplies [rows x window, hidden] matrices where a solo pass multiplies
[window, hidden] ones; the kernels may sum in another order, so fp32 logits can differ in the last
bits, and where two tokens are nearly tied that can flip an argmax. This tool generates the bundled
prompts with greedy decoding alone (the classic loop) and on the batcher at each batch size,
and reports every divergence: the prompt, the first differing position, both tokens, and the
top-2 logit gap of the solo run at that position (a tiny gap: a numerical near-tie).

    python -m benchmarks.batch_check build/smollm2-135m --batches 1,4,16 --max-tokens 64
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

PROMPTS = Path(__file__).resolve().parents[1] / "tools" / "data" / "prompts.jsonl"  # the bench set


def top2_gap(generator, ids: list[int]) -> float:
    """The gap between the two largest logits after `ids`, from a solo pass over them."""
    with generator.backend.context(len(ids) + 1) as ctx:
        chunk = generator.limits.prefill_chunk
        for start in range(0, len(ids), chunk):
            piece = ids[start : start + chunk]
            out = ctx.forward(np.array([piece]), want_logits=start + chunk >= len(ids))
            ctx.commit(len(piece))
    top = np.sort(out.logits[0, -1])[-2:]
    return float(top[1] - top[0])


def divergences(
    generator, prompts: list[list[int]], solo: list[list[int]], batch: int, max_tokens: int, strategy: str
) -> list[dict]:
    from jacobi_rt.runtime.batcher import Batcher

    found = []
    batcher = Batcher.open(generator.backend, batch, prefill_chunk=generator.limits.prefill_chunk).start()
    generator.batcher = batcher  # all prompts at once: `batch` share each pass, the rest wait for a slot
    try:
        results = generator.generate_batch(prompts, max_new_tokens=max_tokens, strategy=strategy)
    finally:
        generator.batcher = None
        batcher.close()
    for i, (alone, result) in enumerate(zip(solo, results)):
        got = result.ids
        if got == alone:
            continue
        at = next((k for k, (a, b) in enumerate(zip(alone, got)) if a != b), min(len(alone), len(got)))
        found.append(
            {
                "batch": batch,
                "prompt": i,
                "position": at,
                "solo": alone[at] if at < len(alone) else None,
                "batched": got[at] if at < len(got) else None,
                "top2_gap": round(top2_gap(generator, prompts[i] + alone[:at]), 6),
            }
        )
    return found


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--batches", default="1,4,16", show_default=True, help="Batch sizes (batcher slots) to compare with solo runs."
)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--prompts", "count", type=click.IntRange(1), default=16, show_default=True, help="How many bundled prompts."
)
@click.option(
    "--strategy", default="greedy", show_default=True, help="The batched runs' strategy (solo runs are greedy)."
)
@click.option("--threads", type=click.IntRange(1), default=None)
@click.option("--out", type=click.Path(dir_okay=False), default="build/batch_check.json", show_default=True)
def main(artifact, batches, max_tokens, count, strategy, threads, out):
    """Compare ARTIFACT's greedy output alone and on the batcher; list every divergence."""
    from jacobi_rt.runtime import Generator

    generator = Generator.load(artifact, threads=threads, graph="inplace", prefix_cache=False)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()][:count]
    prompts = [
        generator.tokenizer.encode(
            generator.chat_prompt([{"role": "user", "content": r["prompt"]}]), add_special_tokens=False
        )
        if r.get("chat")
        else generator.tokenizer.encode(r["prompt"])
        for r in rows
    ]
    longest = generator.limits.max_context - max_tokens - 1
    prompts = [p[-longest:] for p in prompts]  # a tiny test model's short context
    solo = [generator.generate(p, max_new_tokens=max_tokens, strategy="greedy").ids for p in prompts]
    report = {
        "artifact": artifact,
        "max_tokens": max_tokens,
        "strategy": strategy,
        "prompts": len(prompts),
        "tokens": sum(len(s) for s in solo),
        "divergences": [],
    }
    for batch in [int(b) for b in batches.split(",")]:
        found = divergences(generator, prompts, solo, batch, max_tokens, strategy)
        report["divergences"] += found
        click.echo(f"batch {batch:>3}: {len(prompts) - len(found)}/{len(prompts)} outputs equal to solo greedy")
        for d in found:
            click.echo(
                f"    prompt {d['prompt']:>2} position {d['position']:>3}: solo {d['solo']} batched {d['batched']}, "
                f"solo top-2 logit gap {d['top2_gap']}"
            )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2))
    click.echo(f"wrote {out}", err=True)


if __name__ == "__main__":
    main()
