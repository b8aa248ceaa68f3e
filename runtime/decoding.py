"""The decoding loop: prefill, then offer -> allocate -> one target pass -> accept -> commit, until a stop.

Greedy decoding is the same loop with a window of one token and no guesses. Every committed
token is the target's own greedy prediction, so the output equals greedy decoding. With a
sampler (runtime.sampling), each node's prediction is the token sampled from its logits given
its own prefix (the committed tokens and its ancestors in the window) at its absolute position:
a function of the prefix only, so every strategy commits what one-token sampling would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .backends.base import BackendContext
from .passes import PassResult, pass_result
from .proposers import Proposer, observe_costs, send
from .sampling import Sampler
from .tree import build_tree
from .windows import AdaptiveWindow, FixedWindow


@dataclass
class Progress:
    """What the loop did, filled in as it runs (read it after the loop ends)."""

    prefill_passes: int = 0
    prefill_seconds: float = 0.0
    target_passes: int = 0  # decoding passes, prefill not included
    accepted: int = 0  # tokens committed by decoding passes (the prefill's token not included)
    finish_reason: str = ""  # "eos", "length" (max_new_tokens), "context" (max_context); "stop" is set by the caller


def prefill_passes(ctx: BackendContext, prompt: list[int], chunk: int, sampler: Sampler | None = None) -> Iterator[list[int]]:
    """Run the prompt through the graph in chunks and keep all its KV, yielding [] (no tokens yet)
    after every chunk but the last, so a caller can stop between passes; returns the first new token."""
    for start in range(0, len(prompt), chunk):
        if start:
            yield []
        piece = prompt[start : start + chunk]
        last_chunk = start + chunk >= len(prompt)
        out = ctx.forward(np.array([piece], dtype=np.int64), want_logits=_sampling(sampler) and last_chunk)
        ctx.commit(len(piece))
    if not _sampling(sampler):
        return int(out.greedy_ids[0, -1])
    token = sampler.sample(out.logits[0, -1], prompt, len(prompt))
    sampler.record(out.logits[0, -1], token)
    return token


def step(ctx: BackendContext, last: int, proposer: Proposer, budget: int, sampler: Sampler | None = None,
         history: list[int] | None = None, clock: Callable[[], float] = time.perf_counter) -> PassResult:
    """One target pass over `last` and the proposer's guesses (a chain or a tree); returns its PassResult
    (result.committed: the committed tokens), which the proposer has been given.

    history: with a sampler, the committed sequence (prompt, then every new token, `last` included).
    clock: times the target's forward, the one measurement every cost model learns from.
    """
    tree = build_tree(last, send(proposer, budget), max_nodes=budget + 1)  # the allocator cuts the proposer's offer
    positions = ctx.length + np.asarray(tree.positions, dtype=np.int64)
    started = clock()
    out = ctx.forward(np.array([tree.tokens], dtype=np.int64), positions[None], tree.window_mask[None],
                      want_logits=_sampling(sampler))
    seconds = clock() - started
    if _sampling(sampler):
        predictions = sampled_predictions(sampler, out.logits[0], tree.tokens, tree.parents, history)
    else:
        predictions = out.greedy_ids[0].tolist()
    verdict = tree.accept(predictions)  # the walk down the target's own predictions: what one token a pass emits
    if _sampling(sampler):
        for row, token in zip(verdict.keep, verdict.committed):
            sampler.record(out.logits[0, row], token)
    if verdict.contiguous:
        ctx.commit(len(verdict.keep))  # KV of last + accepted guesses; committed[-1] has no KV yet
    else:
        ctx.commit_rows(verdict.keep)  # an accepted side branch: gather its KV rows into place
    result = pass_result(tree, predictions, verdict, seconds)
    observe_costs(proposer, result)  # the loop teaches the cost curves, once per pass
    proposer.update(result)
    return result


def sampled_predictions(sampler: Sampler, logits: np.ndarray, tokens: list[int], parents: list[int],
                        history: list[int]) -> list[int]:
    """The token sampled at each window node: node i's prefix is the history and its ancestors' tokens
    below the root plus its own, its position len(history) + depth (the root is history[-1])."""
    paths: list[list[int]] = []
    predictions = []
    for node, parent in enumerate(parents):
        path = [] if parent < 0 else [*paths[parent], tokens[node]]
        paths.append(path)
        prefix = history + path
        predictions.append(sampler.sample(logits[node], prefix, len(prefix)))
    return predictions


def _sampling(sampler: Sampler | None) -> bool:
    return sampler is not None and not sampler.greedy


def decode(
    ctx: BackendContext,
    prompt: list[int],
    proposer: Proposer,
    window: int | FixedWindow | AdaptiveWindow,
    max_new_tokens: int,
    max_context: int,
    eos_ids: set[int],
    prefill_chunk: int,
    progress: Progress,
    sampler: Sampler | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[list[int]]:
    """Yield the new tokens pass by pass (an empty list after each prefill chunk but the last); stops after
    EOS (included), max_new_tokens or the context limit.

    window: a window size, or a policy (runtime.windows) that picks each pass's window.
    sampler: sample each token (runtime.sampling); None or a greedy sampler: the in-graph greedy ids.
    clock: times the prefill and each target forward (tests inject one).
    """
    policy = FixedWindow(window) if isinstance(window, int) else window
    started = clock()
    last = yield from prefill_passes(ctx, prompt, prefill_chunk, sampler)
    progress.prefill_passes = -(-len(prompt) // prefill_chunk)
    progress.prefill_seconds = clock() - started
    proposer.use_sampler(sampler if _sampling(sampler) else None)
    proposer.start(prompt, last)
    history = [*prompt, last] if _sampling(sampler) else None
    new = [last]
    produced = 1
    while True:
        cut = next((i for i, t in enumerate(new) if t in eos_ids), None)
        if cut is not None:
            progress.accepted -= len(new) - cut - 1  # the pass committed tokens after the EOS; they are dropped
            yield new[: cut + 1]
            progress.finish_reason = "eos"
            return
        yield new
        if produced >= max_new_tokens:
            progress.finish_reason = "length"
            return
        # The new last token sits at position ctx.length; a pass of w predicts positions up to length + w.
        room = max_context - 1 - ctx.length
        if room < 1:
            progress.finish_reason = "context"
            return
        w = min(policy.next(), max_new_tokens - produced, room)
        result = step(ctx, last, proposer, w - 1, sampler, history, clock)
        new = result.committed
        if history is not None:
            history += new
        policy.observe(result)
        last = new[-1]
        produced += len(new)
        progress.target_passes += 1
        progress.accepted += len(new)
