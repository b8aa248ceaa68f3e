"""Draft slots: one draft context of S rows for a batcher's drafting rows, so their guesses come from one
batched draft pass a step instead of one pass per row.

Each row's DraftProposer sits on a row of the slots' context (`DraftRow`) instead of a context of its
own; its `take` only says how many tokens it wants (`want`), and the batcher, once every row of the pass
has taken its guesses, runs the draft step (`run`), which fills each wanted chain in place:

    pass 1     rows [lo, hi): each wanting row's pending committed tokens + Jacobi guesses, padded
               to the widest (padding attends to itself; rows in range that want nothing run a pad)
    pass 2..K  each row still short of its K feeds its last draft token; rows done (or padded) wait

A pass of 8 rows costs 0.33-0.52 of 8 one-row passes (SmolLM2 int8 draft, past 100-500, this CPU:
docs/bench/2026-12-02-batched-draft.md). Each pass is timed here, once, and each row it served is
charged its share (seconds / rows served): what its DraftLength learns as the draft's cost, so the
allocator prices a row's draft at what the batch really pays for it. The rows' catch-ups (a new row's
prompt) are fed together too, before pass 1. The draft only guesses, so the rows' outputs stay the target's.
The slots live with the batcher; a finished row's draft cache is copied out for the prefix cache
(`DraftRow.copy`) and the slot goes to the next row. A lone call (run_alone) has no slots: its draft
keeps its own context and passes.
"""

from __future__ import annotations

import time

import numpy as np

from .backends.base import Backend, lower_triangular, padded
from .draft import CATCHUP, DraftProposer
from .proposers import Composite, Proposer

SPARE = CATCHUP + 64  # entries past a row's capacity that a pad may write (a window of pending tokens + 63 guesses)


class DraftSlots:
    """S rows of one draft context; `seat` gives a row's drafts a slot, `run` is the batcher's draft step."""

    def __init__(self, backend: Backend, slots: int, capacity: int, clock=time.perf_counter):
        self.backend = backend
        self.capacity = capacity
        self.ctx = backend.context(capacity + SPARE, batch=slots)
        self.free = list(range(slots))  # the lowest is taken first: drafting rows stay low, passes narrow
        self.wanted: list[tuple[DraftProposer, int]] = []
        self.clock = clock
        self.passes = 0  # batched draft passes run (for tests and tools)

    @classmethod
    def open(cls, backend: Backend | None, slots: int, capacity: int) -> "DraftSlots | None":
        """Slots for a batcher of `slots` rows when its draft's contexts hold rows of their own (the in-place graph)."""
        if backend is None or slots < 2 or not backend.batched:
            return None
        return cls(backend, slots, min(capacity, backend.limits.max_context))

    def seat(self, proposer: Proposer) -> None:
        """Seat the drafts inside `proposer` (a speculative row's, or auto's draft arm's); one without a free
        slot keeps its own context."""
        for draft in drafts_in(proposer):
            if self.free and draft.seat is None:
                self.free.sort()
                draft.sit(DraftRow(self, self.free.pop(0)))

    def release(self, row: int) -> None:
        self.ctx.trim_row(row, 0)
        self.free.append(row)

    def run(self) -> None:
        """Fill every chain wanted this step: the catch-ups, one batched pass for the first tokens, then one per
        further token."""
        wanted, self.wanted = self.wanted, []
        if not wanted:
            return
        self._catch_up([draft for draft, _ in wanted])
        firsts = [(draft, k, *draft._window(k)) for draft, k in wanted]
        windows = {draft.seat.row: window for draft, _, window, _, _ in firsts}
        befores = [draft.before(draft.known, pending - 1) for draft, _, _, pending, _ in firsts]
        out, lo, seconds = self._pass(windows, any(b is not None for b in befores))
        keeps = [[] for _ in range(out.greedy_ids.shape[0])]
        for (draft, k, window, pending, guesses), before in zip(firsts, befores):
            i = draft.seat.row - lo
            ids = draft.picks(window, out.greedy_ids[i], _row(out.logits, i), pending - 1, before)
            draft.chain.extend(draft._chain(pending, guesses, ids, k))
            keeps[i] = list(range(pending + len(draft.chain) - 1))
        self.ctx.commit_each(keeps)
        self._charge([draft for draft, *_ in firsts], seconds, narrow=max(map(len, windows.values())) <= 2)
        while active := [draft for draft, k in wanted if len(draft.chain) < k]:
            befores = [draft.before([*draft.known, *draft.chain], 0) for draft in active]
            out, lo, seconds = self._pass({d.seat.row: [d.chain[-1]] for d in active}, any(b is not None for b in befores))
            keeps = [[] for _ in range(out.greedy_ids.shape[0])]
            for draft, before in zip(active, befores):
                i = draft.seat.row - lo
                draft.chain.append(draft.picks([draft.chain[-1]], out.greedy_ids[i], _row(out.logits, i), 0, before)[0])
                keeps[i] = [0]
            self.ctx.commit_each(keeps)
            self._charge(active, seconds, narrow=True)
        for draft, _ in wanted:
            draft.stats["proposed"] += len(draft.chain)

    def _catch_up(self, drafts: list[DraftProposer]) -> None:
        """Feed the rows with more than CATCHUP pending tokens (a new row's prompt, or what the target committed
        while its draft sat out) all but their last, together, in chunks of at most SPARE tokens."""
        late = [d for d in drafts if len(d.tokens) - d.ctx.length > min(CATCHUP, d.max_window or CATCHUP)]
        while late:
            chunk = min(SPARE, *(d.prefill_chunk for d in late), *(d.max_window or SPARE for d in late))
            windows = {d.seat.row: d.tokens[d.ctx.length : len(d.tokens) - 1][:chunk] for d in late}
            out, lo, seconds = self._pass(windows, False)
            keeps = [[] for _ in range(out.greedy_ids.shape[0])]
            for d in late:
                keeps[d.seat.row - lo] = list(range(len(windows[d.seat.row])))
            self.ctx.commit_each(keeps)
            for d in late:
                d.catchup_seconds += seconds / len(late)  # paid once: not the draft's per-pass cost
                d._count(1, seconds / len(late))
            late = [d for d in late if len(d.tokens) - d.ctx.length > 1]

    def _pass(self, windows: dict[int, list[int]], want_logits: bool):
        """One draft pass over slots [lo, hi) covering `windows` (slot -> tokens), timed: (output, lo, seconds)."""
        lo, hi = min(windows), max(windows) + 1
        lengths = self.ctx.lengths[lo:hi].tolist()
        rows = [windows.get(lo + i, [0]) for i in range(hi - lo)]  # a row in range that wants nothing runs a pad
        ids, positions, mask = padded([(w, n + np.arange(len(w)), lower_triangular(len(w))) for w, n in zip(rows, lengths)])
        self.ctx.select(lo, hi)
        started = self.clock()
        out = self.ctx.forward(ids, positions, mask, want_logits=want_logits)
        self.passes += 1
        return out, lo, self.clock() - started  # the one timing of the draft's batched passes

    @staticmethod
    def _charge(drafts: list[DraftProposer], seconds: float, narrow: bool) -> None:
        """Each row a pass served pays its share: its draft time, and (1-2 token passes) its cost estimate."""
        share = seconds / len(drafts)
        for draft in drafts:
            draft._count(1, share)
            if narrow:
                draft.length.observe_draft(share)

    def close(self) -> None:
        self.ctx.close()


class DraftRow:
    """Row `row` of the slots' context as the one-row context a DraftProposer drives (its catch-up, trims,
    the prefix cache's copies); `want` puts its chain in the batcher's next draft step."""

    def __init__(self, slots: DraftSlots, row: int):
        self.slots, self.row = slots, row
        self.capacity = slots.capacity

    @property
    def length(self) -> int:
        return int(self.slots.ctx.lengths[self.row])

    def want(self, draft: DraftProposer, k: int) -> None:
        self.slots.wanted.append((draft, k))

    def forward(self, ids, positions=None, window_mask=None, want_logits=False):
        self.slots.ctx.select(self.row, self.row + 1)
        return self.slots.ctx.forward(ids, positions, window_mask, want_logits)

    def commit(self, n: int) -> None:
        self.slots.ctx.commit(n)

    def trim(self, length: int) -> None:
        self.slots.ctx.trim_row(self.row, length)

    def load_prefix(self, source, length: int) -> bool:
        return self.slots.ctx.load_prefix(source, length, row=self.row)

    def copy(self, backend: Backend):
        """A one-row context of its own holding this row's cache (what the prefix cache keeps)."""
        ctx = backend.context(self.capacity)
        ctx.load_prefix(self.slots.ctx, self.length, source_row=self.row)
        return ctx

    def close(self) -> None:
        if self.slots is not None:
            self.slots.release(self.row)
            self.slots = None


def drafts_in(proposer: Proposer) -> list[DraftProposer]:
    """The draft proposers inside `proposer`: itself, a union's parts, auto's arms."""
    if isinstance(proposer, DraftProposer):
        return [proposer]
    parts = proposer.parts if isinstance(proposer, Composite) else {}
    return [draft for part in parts.values() for draft in drafts_in(part)]


def _row(logits: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if logits is None else logits[i]
