"""One row run alone on a backend context through the batcher's loop (runtime.batcher.run_alone), as tests drive it."""

from __future__ import annotations

import time
from collections.abc import Iterator

from jacobi_rt.runtime.allocator import Allocation, allocate, produced, sent_guesses
from jacobi_rt.runtime.batcher import run_alone
from jacobi_rt.runtime.draft import produce
from jacobi_rt.runtime.proposers import own_cost
from jacobi_rt.runtime.row import Row


def passes(
    ctx,
    prompt,
    proposer,
    window,
    max_new: int,
    max_context: int | None = None,
    eos=(),
    chunk: int = 256,
    sampler=None,
    clock=time.perf_counter,
) -> tuple[Row, Iterator[list[int]]]:
    """(the row, its committed tokens pass by pass as they come: [] after each prompt chunk but the last)."""
    row = Row(list(prompt), max_new, proposer, sampler, window, set(eos), max_context or ctx.capacity)
    return row, run_alone(ctx, row, chunk, clock=clock)


def decode(ctx, prompt, proposer, window, max_new: int, **kw) -> tuple[Row, list[list[int]]]:
    """passes() run to the end."""
    row, batches = passes(ctx, prompt, proposer, window, max_new, **kw)
    return row, list(batches)


def tokens(ctx, prompt, proposer, window, max_new: int, **kw) -> list[int]:
    return [t for batch in decode(ctx, prompt, proposer, window, max_new, **kw)[1] for t in batch]


def propose(proposer, limit: int, cost=None) -> tuple[list[list[int]], Allocation]:
    """What one pass with room for `limit` guessed tokens sends, as a row alone plans it: the proposer's
    offer cut by the allocator (against `cost`, default its own curve), a draft's chain produced by the
    draft step; and that allocation, which the pass's result carries back (`pass_result(..., sent=)`)."""
    offer = proposer.offer(limit)
    allocation = allocate(offer, limit, cost or own_cost(proposer))
    produce(produced(offer, allocation))
    return sent_guesses(offer, allocation), allocation


def send(proposer, limit: int, cost=None) -> list[list[int]]:
    """propose()'s guesses alone."""
    return propose(proposer, limit, cost)[0]
