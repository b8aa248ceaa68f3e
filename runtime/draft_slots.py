"""Draft slots: the one place the draft's passes run and are timed. S rows of one draft context; every
DraftProposer sits on a row of one (`DraftRow`): a lone call's draft on one-row slots of its own, a batcher's
drafting rows on the batcher's slots, so their guesses come from one batched draft pass a step instead of
one pass per row.

A draft's `take` only says how many tokens it wants (`want`); the step (`run`) fills each wanted chain in
place, at once on one-row slots, and for a batcher once every row of the pass has taken its guesses:

    pass 1     rows [lo, hi): each wanting row's pending committed tokens + Jacobi guesses, padded
               to the widest (padding attends to itself; rows in range that want nothing run a pad)
    pass 2..K  each row still short of its K feeds its last draft token; rows done (or padded) wait

A pass of 8 rows costs 0.33-0.52 of 8 one-row passes (SmolLM2 int8 draft, past 100-500, this CPU:
docs/bench/2026-12-02-batched-draft.md). Each pass is timed here, once, and each row it served is
charged its share (seconds / rows served); each 1-2 token pass's share is what its DraftLength learns
as the draft's cost, so the allocator prices a row's draft at what the batch really pays for it. The
rows' catch-ups (a new row's prompt) are fed together too, before pass 1. The draft only guesses, so the
rows' outputs stay the target's. A finished row's draft cache goes to the prefix cache as one-row slots
(`DraftRow.detach`): a lone draft's own, or, for a batcher's row, a copy, the slot going to the next row.
"""

from __future__ import annotations

import time

import numpy as np

from .backends.base import Backend, lower_triangular, padded
from .proposers import Proposer

CATCHUP = 8  # more pending tokens than this are fed as a catch-up before the proposal's own pass
SPARE = CATCHUP + 64  # entries past a row's capacity that a pad may write (a window of pending tokens + 63 guesses)


class DraftSlots:
    """S rows of one draft context; `seat` gives a row's drafts a slot, `run` is the draft step (the batcher's,
    or at each `want` on one-row slots: a lone draft's own, with no pads, so no SPARE)."""

    def __init__(self, backend: Backend, slots: int, capacity: int):
        self.backend = backend
        self.capacity = capacity
        self.lone = slots == 1
        self.ctx = backend.context(capacity + (0 if self.lone else SPARE), batch=slots)
        self.free = list(range(slots))  # the lowest is taken first: drafting rows stay low, passes narrow
        self.wanted: list[tuple[Proposer, int]] = []

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

    def seat(self, drafts: list[Proposer]) -> None:
        """Seat a row's draft proposers (runtime.draft.drafts_in: a speculative row's, or auto's draft arm's);
        one without a free slot keeps its own."""
        for draft in drafts:
            if self.free and draft.row.slots.lone:
                self.free.sort()
                draft.sit(DraftRow(self, self.free.pop(0)))

    def release(self, row: int) -> None:
        if self.lone:
            self.ctx.close()
            return
        self.ctx.trim_row(row, 0)
        self.free.append(row)

    def run(self) -> None:
        """Fill every chain wanted this step: the catch-ups, one batched pass for the first tokens, then one per
        further token."""
        wanted, self.wanted = self.wanted, []
        if not wanted:
            return
        self._catch_up([draft for draft, _ in wanted])
        firsts = [(draft, k, *draft.window(k)) for draft, k in wanted]
        windows = {draft.row.row: window for draft, _, window, _, _ in firsts}
        befores = [draft.before(draft.known, pending - 1) for draft, _, _, pending, _ in firsts]
        out, lo, seconds = self._pass(windows, any(b is not None for b in befores))
        keeps = [[] for _ in range(out.greedy_ids.shape[0])]
        for (draft, k, window, pending, guesses), before in zip(firsts, befores):
            i = draft.row.row - lo
            ids = draft.picks(window, out.greedy_ids[i], _row(out.logits, i), pending - 1, before)
            draft.chain.extend(draft.first_chain(pending, guesses, ids, k))
            keeps[i] = list(range(pending + len(draft.chain) - 1))
        self.ctx.commit_each(keeps)
        self._charge([draft for draft, *_ in firsts], seconds, narrow=max(map(len, windows.values())) <= 2)
        while active := [draft for draft, k in wanted if len(draft.chain) < k]:
            befores = [draft.before([*draft.known, *draft.chain], 0) for draft in active]
            out, lo, seconds = self._pass(
                {d.row.row: [d.chain[-1]] for d in active}, any(b is not None for b in befores)
            )
            keeps = [[] for _ in range(out.greedy_ids.shape[0])]
            for draft, before in zip(active, befores):
                i = draft.row.row - lo
                draft.chain.append(draft.picks([draft.chain[-1]], out.greedy_ids[i], _row(out.logits, i), 0, before)[0])
                keeps[i] = [0]
            self.ctx.commit_each(keeps)
            self._charge(active, seconds, narrow=True)
        for draft, _ in wanted:
            draft.stats["proposed"] += len(draft.chain)

    def _catch_up(self, drafts: list[Proposer]) -> None:
        """Feed the rows with more than CATCHUP pending tokens (a new row's prompt, or what the target committed
        while its draft sat out) all but their last, together, in prefill chunks (of at most SPARE tokens when
        other rows may run a pad)."""
        late = [d for d in drafts if len(d.tokens) - d.row.length > min(CATCHUP, d.max_window or CATCHUP)]
        while late:
            chunk = min(*(d.prefill_chunk for d in late), *(d.max_window or d.prefill_chunk for d in late))
            chunk = chunk if self.lone else min(chunk, SPARE)
            windows = {d.row.row: d.tokens[d.row.length : len(d.tokens) - 1][:chunk] for d in late}
            out, lo, seconds = self._pass(windows, False)
            keeps = [[] for _ in range(out.greedy_ids.shape[0])]
            for d in late:
                keeps[d.row.row - lo] = list(range(len(windows[d.row.row])))
            self.ctx.commit_each(keeps)
            self._charge(late, seconds, catch_up=True)
            late = [d for d in late if len(d.tokens) - d.row.length > 1]

    def _pass(self, windows: dict[int, list[int]], want_logits: bool):
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

    @staticmethod
    def _charge(drafts: list[Proposer], seconds: float, narrow: bool = False, catch_up: bool = False) -> None:
        """Each row a pass served pays its share: its draft time, and (1-2 token passes) its cost estimate; a
        catch-up is paid once, not the draft's per-pass cost (`own_seconds` leaves it out)."""
        share = seconds / len(drafts)
        for draft in drafts:
            draft.stats["draft_passes"] += 1
            draft.stats["draft_seconds"] += share
            if catch_up:
                draft.catchup_seconds += share
            elif narrow:
                draft.length.observe_draft(share)

    def close(self) -> None:
        self.ctx.close()


class DraftRow:
    """Row `row` of the slots' context as the one-row cache a DraftProposer keeps (its trims, the prefix
    cache's handover); `want` puts its chain in the slots' next draft step."""

    def __init__(self, slots: DraftSlots, row: int):
        self.slots, self.row = slots, row
        self.capacity = slots.capacity

    @property
    def length(self) -> int:
        return int(self.slots.ctx.lengths[self.row])

    def want(self, draft: Proposer, k: int) -> None:
        self.slots.wanted.append((draft, k))
        if self.slots.lone:  # no batcher's step: the chain is filled now
            self.slots.run()

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


def _row(logits: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if logits is None else logits[i]
