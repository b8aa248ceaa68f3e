"""Draft slots: the one place the draft's passes run and are timed. S rows of one draft context; every
DraftProposer sits on a row of one (`DraftRow`): a lone call's draft on one-row slots of its own, a batcher's
drafting rows on the batcher's slots, so their guesses come from one batched draft pass a step instead of
one pass per row (runtime.draft.produce decides what each pass feeds):

    pass 1     rows [lo, hi): each wanting row's pending committed tokens + Jacobi guesses, padded
               to the widest (padding attends to itself; rows in range that want nothing run a pad)
    pass 2..K  each row still short of its K feeds its last draft token; rows done (or padded) wait

A pass of 8 rows costs 0.33-0.52 of 8 one-row passes (SmolLM2 int8 draft, past 100-500, this CPU:
docs/bench/2026-12-02-batched-draft.md). Each pass is timed here, once (`forward`); the draft step charges
each row it served its share. The draft only guesses, so the rows' outputs stay the target's. A finished
row's draft cache goes to the prefix cache as one-row slots (`DraftRow.detach`): a lone draft's own, or,
for a batcher's row, a copy, the slot going to the next row.
"""

from __future__ import annotations

import time

import numpy as np

from .backends.base import Backend, lower_triangular, padded

CATCHUP = 8  # more pending tokens than this are fed as a catch-up before the proposal's own pass
SPARE = CATCHUP + 64  # entries past a row's capacity that a pad may write (a window of pending tokens + 63 guesses)


class DraftSlots:
    """S rows of one draft context; `free_row` seats a draft, `forward` runs one timed draft pass
    (one-row slots, a lone draft's own, run no pads, so they need no SPARE)."""

    def __init__(self, backend: Backend, slots: int, capacity: int):
        self.backend = backend
        self.capacity = capacity
        self.lone = slots == 1
        self.ctx = backend.context(capacity + (0 if self.lone else SPARE), batch=slots)
        self.free = list(range(slots))

    @classmethod
    def open(cls, backend: Backend | None, slots: int, capacity: int) -> DraftSlots | None:
        """Slots for a batcher of `slots` rows when its draft's contexts hold rows of their own (the in-place graph)."""
        if backend is None or slots < 2 or not backend.batched:
            return None
        return cls(backend, slots, min(capacity, backend.limits.max_context))

    @classmethod
    def row_of_its_own(cls, backend: Backend, capacity: int) -> DraftRow:
        """The row of one-row slots (a lone draft's, or a kept draft cache)."""
        return DraftRow(cls(backend, 1, capacity), 0)

    def free_row(self) -> DraftRow | None:
        """The lowest free row (drafting rows stay low, so their passes stay narrow), or None when all are taken."""
        if not self.free:
            return None
        self.free.sort()
        return DraftRow(self, self.free.pop(0))

    def release(self, row: int) -> None:
        if self.lone:
            self.ctx.close()
            return
        self.ctx.trim_row(row, 0)
        self.free.append(row)

    def forward(self, windows: dict[int, list[int]], want_logits: bool):
        """One draft pass over slots [lo, hi) covering `windows` (slot -> tokens), timed: (output, lo, seconds)."""
        lo, hi = min(windows), max(windows) + 1
        lengths = self.ctx.lengths[lo:hi].tolist()
        rows = [windows.get(lo + i, [0]) for i in range(hi - lo)]  # a row in range that wants nothing runs a pad
        ids, positions, mask = padded(
            [(w, n + np.arange(len(w)), lower_triangular(len(w))) for w, n in zip(rows, lengths)]
        )
        self.ctx.select(lo, hi)
        started = time.perf_counter()
        out = self.ctx.forward(ids, positions, mask, want_logits=want_logits)
        return out, lo, time.perf_counter() - started  # the one timing of the draft's passes

    def commit_each(self, keeps: list[list[int]]) -> None:
        """Keep each row's entries of the last pass (runtime.backends' row contract)."""
        self.ctx.commit_each(keeps)

    def close(self) -> None:
        self.ctx.close()


class DraftRow:
    """Row `row` of the slots' context as the one-row cache a DraftProposer keeps (its trims, the prefix
    cache's handover)."""

    def __init__(self, slots: DraftSlots, row: int):
        self.slots, self.row = slots, row
        self.capacity = slots.capacity

    @property
    def length(self) -> int:
        return int(self.slots.ctx.lengths[self.row])

    def trim(self, length: int) -> None:
        self.slots.ctx.trim_row(self.row, length)

    def load_prefix(self, source: DraftRow, length: int) -> bool:
        return self.slots.ctx.load_prefix(source.slots.ctx, length, row=self.row, source_row=source.row)

    def detach(self) -> DraftRow:
        """This row's cache on one-row slots (what the prefix cache keeps): itself when the slots are its own
        (no copy), else a copy, and the slot goes back to the batcher."""
        if self.slots.lone:
            return self
        own = DraftSlots.row_of_its_own(self.slots.backend, self.capacity)
        own.load_prefix(self, self.length)
        self.close()
        return own

    def close(self) -> None:
        if self.slots is not None:
            self.slots.release(self.row)
            self.slots = None
