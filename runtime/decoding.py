"""The decoding loop: prefill, then propose -> one target pass -> accept -> commit, until a stop.

Greedy decoding is the same loop with a window of one token and no guesses. Every committed
token is the target's own greedy prediction, so the output equals greedy decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .backends.base import BackendContext
from .proposers import Proposer
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


def prefill(ctx: BackendContext, prompt: list[int], chunk: int) -> int:
    """Run the prompt through the graph in chunks, keep all its KV; return the first new token."""
    for start in range(0, len(prompt), chunk):
        piece = prompt[start : start + chunk]
        out = ctx.forward(np.array([piece], dtype=np.int64))
        ctx.commit(len(piece))
    return int(out.greedy_ids[0, -1])


def step(ctx: BackendContext, last: int, proposer: Proposer, budget: int) -> list[int]:
    """One target pass over `last` and the proposer's guesses (a chain or a tree); returns the committed tokens."""
    tree = build_tree(last, proposer.propose(budget), max_nodes=budget + 1)
    positions = ctx.length + np.asarray(tree.positions, dtype=np.int64)
    out = ctx.forward(np.array([tree.tokens], dtype=np.int64), positions[None], tree.window_mask[None])
    predictions = out.greedy_ids[0].tolist()
    verdict = tree.accept(predictions)  # the walk down the target's own predictions: greedy's tokens
    if verdict.contiguous:
        ctx.commit(len(verdict.keep))  # KV of last + accepted guesses; committed[-1] has no KV yet
    else:
        ctx.commit_rows(verdict.keep)  # an accepted side branch: gather its KV rows into place
    proposer.update(tree, predictions, verdict)
    return verdict.committed


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
) -> Iterator[list[int]]:
    """Yield the new tokens pass by pass; stops after EOS (included), max_new_tokens or the context limit.

    window: a window size, or a policy (runtime.windows) that picks each pass's window.
    """
    policy = FixedWindow(window) if isinstance(window, int) else window
    started = time.perf_counter()
    last = prefill(ctx, prompt, prefill_chunk)
    progress.prefill_passes = -(-len(prompt) // prefill_chunk)
    progress.prefill_seconds = time.perf_counter() - started
    proposer.start(prompt, last)
    new = [last]
    produced = 1
    while True:
        cut = next((i for i, t in enumerate(new) if t in eos_ids), None)
        if cut is not None:
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
        began = time.perf_counter()
        new = step(ctx, last, proposer, w - 1)
        policy.observe(w, len(new), time.perf_counter() - began)
        last = new[-1]
        produced += len(new)
        progress.target_passes += 1
        progress.accepted += len(new)
