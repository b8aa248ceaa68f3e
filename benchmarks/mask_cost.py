"""What a constraint's masks cost per pass, against a one-token pass of the model (issue 23's <= 10% goal).

    python -m benchmarks.mask_cost ARTIFACT [--set benchmarks/data/extraction.jsonl] [--repeats 3]

For each extraction item, the grammar walks the item's example answer (the tokens a model would
commit) and at every position times, through runtime/grammar.Matcher:
  - `w1`: the mask after the committed tokens (a one-token pass),
  - `chain8`: a chain window of the next 7 tokens (8 rows: what Jacobi or a draft sends),
  - `tree8`: two branches of 4 tokens (the true continuation and one with another last token),
  - `executor8`: the same chain through llguidance's batched executor (compute_mask_ptr_with_draft_token),
  - `pick`: turning a row into a bool vocabulary mask and the greedy pick over it (host side, per row).
Then it times one-token passes of the artifact (onnxruntime, one thread) at a past of the prompt's
length, so the two costs are compared in one run. Prints a table (ms) and the share of a pass.
"""

from __future__ import annotations

import json
import statistics
import time

import click
import numpy as np


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--set",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A JSONL set like benchmarks/data/extraction.jsonl (default: the bundled one).",
)
@click.option(
    "--repeats", type=click.IntRange(1, 20), default=3, show_default=True, help="Walks per item (the median is kept)."
)
@click.option("--passes", type=click.IntRange(5, 500), default=40, show_default=True, help="One-token passes to time.")
@click.option(
    "--threads", type=click.IntRange(1, 64), default=1, show_default=True, help="onnxruntime threads for the passes."
)
def main(artifact, path, repeats, passes, threads):
    from benchmarks.extraction import extraction_set
    from jacobi_rt.runtime.constraints import Constraint
    from jacobi_rt.runtime.grammar import grammar_tokenizer
    from jacobi_rt.runtime.manifest import load_manifest
    from jacobi_rt.runtime.tokenizer import Tokenizer

    manifest = load_manifest(artifact, verify=False)
    tokenizer = Tokenizer(artifact, manifest)
    started = time.perf_counter()
    bridge = grammar_tokenizer(tokenizer, manifest.architecture.vocab_size, manifest.tokens.eos_ids)
    click.echo(f"tokenizer bridge: {1e3 * (time.perf_counter() - started):.0f} ms (once per tokenizer)")
    rows = []
    for item in extraction_set(path):
        constraint = Constraint.json_schema(item.schema)
        started = time.perf_counter()
        bridge.matcher(constraint)
        made = time.perf_counter() - started
        ids = (
            tokenizer.encode(json.dumps(item.example, ensure_ascii=False), add_special_tokens=False)
            + sorted(bridge.eos_ids)[:1]
        )
        walks = [walk(bridge, constraint, ids) for _ in range(repeats)]
        rows.append((item.id, len(ids), 1e3 * made, {k: statistics.median(w[k] for w in walks) for k in walks[0]}))
    pass_ms = one_token_pass_ms(artifact, manifest, tokenizer, passes, threads)
    keys = list(rows[0][3])
    click.echo(
        f"{'item':10s} {'tokens':>6s} {'matcher':>8s} " + " ".join(f"{k:>10s}" for k in keys) + "   (ms, mean per pass)"
    )
    for name, n, made, cost in rows:
        click.echo(f"{name:10s} {n:6d} {made:8.2f} " + " ".join(f"{cost[k]:10.3f}" for k in keys))
    means = {k: statistics.mean(r[3][k] for r in rows) for k in keys}
    click.echo(
        f"{'mean':10s} {'':6s} {statistics.mean(r[2] for r in rows):8.2f} "
        + " ".join(f"{means[k]:10.3f}" for k in keys)
    )
    click.echo(
        f"one-token pass ({threads} thread{'s' if threads > 1 else ''}): {pass_ms:.2f} ms median; "
        + ", ".join(f"{k} {100 * means[k] / pass_ms:.2f}%" for k in keys)
    )


def walk(bridge, constraint, ids: list[int]) -> dict[str, float]:
    """Mean ms per pass of each kind of window along the answer `ids`."""
    from jacobi_rt.runtime.sampling import masked_greedy
    from jacobi_rt.runtime.tree import build_tree

    matcher = bridge.matcher(constraint)
    spent = {"w1": [], "chain8": [], "tree8": [], "executor8": [], "pick": []}
    executor = _executor()
    logits = np.random.default_rng(0).standard_normal(bridge.vocab_size).astype(np.float32)
    root = ids[0]
    for i in range(len(ids)):
        spent["w1"].append(_timed(matcher.masks, [root], [-1]))
        rest = ids[i : i + 7]
        chain = build_tree(root, [rest])
        spent["chain8"].append(_timed(matcher.masks, chain.tokens, chain.parents))
        other = rest[:3] + [(rest[3] + 1) % bridge.vocab_size] if len(rest) >= 4 else rest
        tree = build_tree(root, [rest[:4], other])
        spent["tree8"].append(_timed(matcher.masks, tree.tokens, tree.parents))
        if executor is not None:
            spent["executor8"].append(_timed(_executor_chain, executor, matcher, rest, bridge.words))
        masks = matcher.masks([root], [-1])
        started = time.perf_counter()
        masked_greedy(logits, int(np.argmax(logits)), masks.allowed(0))
        spent["pick"].append(1e3 * (time.perf_counter() - started))
        matcher.commit([ids[i]])
        root = ids[i]
        if matcher.finished:
            break
    return {k: statistics.mean(v) for k, v in spent.items() if v}


def _timed(call, *args) -> float:
    started = time.perf_counter()
    call(*args)
    return 1e3 * (time.perf_counter() - started)


def _executor():
    import llguidance

    try:
        return llguidance.LLExecutor(num_threads=1)
    except Exception:  # an llguidance without the executor: the column is left out
        return None


def _executor_chain(executor, matcher, draft: list[int], words: int) -> None:
    """The chain's masks in one call of llguidance's executor (rows 0..len(draft)); the draft is first
    cut to what the grammar accepts, as the engine would."""
    draft = draft[: matcher.cut(draft)]
    bits = np.full((len(draft) + 1, words), -1, dtype=np.int32)
    executor.unsafe_compute_mask_ptr_with_draft_token([(matcher._m, 0, draft)], bits.ctypes.data, words * 4, len(bits))


def one_token_pass_ms(artifact, manifest, tokenizer, passes: int, threads: int) -> float:
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend

    prompt = tokenizer.encode("Extract the person described in the text. " * 8, add_special_tokens=False)
    times = []
    with OrtBackend(artifact, manifest, "cpu", threads) as backend, backend.context(len(prompt) + passes + 1) as ctx:
        ctx.forward(np.array([prompt], dtype=np.int64))
        ctx.commit(len(prompt))
        token = prompt[-1]
        for _ in range(passes):
            started = time.perf_counter()
            out = ctx.forward(np.array([[token]], dtype=np.int64), want_logits=True)
            times.append(1e3 * (time.perf_counter() - started))
            ctx.commit(1)
            token = int(out.greedy_ids[0, 0])
    return statistics.median(times)


if __name__ == "__main__":
    main()
