"""The batcher: the one decoding loop, for a lone generation (a batch of one row) and for many.

One backend context holds S slots (rows of the cache, each with its own length; a context of the
portable graph or TensorRT holds one). Each `step()` is one target pass:

    1. drop finished and cancelled rows (their slots keep what they cached: runtime.prefix_cache),
       admit waiting ones, each seated on the idle slot holding the longest prefix of its prompt, and
       keep the active rows packed in the lowest slots, so a pass runs rows [0, k);
    2. schedule the pass (`_schedule`): a prefill pass (rows still reading their prompt, chunks split by
       the budget) alternates with a decoding pass while both kinds of rows wait; the budget
       (runtime.pass_budget) prices the decoding pass's width from the cost curve and the rows' bids;
    3. plan: every row in the pass builds its window (a prompt chunk, or its last token + the guesses
       the allocator sent as a tree); rows are padded to one width (padding attends to itself only and
       is never committed);
    4. one forward, timed here and nowhere else;
    5. accept and commit: each row reads its predictions (the in-graph greedy ids, or its sampler on its
       own logits), walks its tree, keeps its own entries, and hands its proposer the one PassResult.

A lone `Generator.generate()` runs `run_alone` in the caller's thread; `Generator.start_batching()` runs
`Batcher.start()`'s thread for every caller. Every committed token is the target's own prediction
given its prefix, so each row equals its own one-token decoding (greedy, or seeded sampling). The
scheduling is the batcher's alone (`_admit`, `_seat`, `_schedule`); a row (runtime.row) plans and
settles its own part of a pass.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .backends.base import Backend, BackendContext, padded
from .draft import produce, seat
from .draft_slots import DraftSlots
from .errors import BackendError, InputError
from .pass_budget import PassBudget
from .prefix_cache import PrefixCache
from .row import END, Row


@dataclass
class PassRecord:
    """What one batcher pass did (for metrics and tests)."""

    kind: str  # "prefill" or "decode"
    rows: int
    window: int  # the pass's width
    tokens: int  # tokens committed (prompt chunks included)
    seconds: float


@dataclass
class BatcherStats:
    passes: int = 0
    rows: int = 0  # sum over passes
    tokens: int = 0
    last: PassRecord | None = None
    observers: list[Callable[[PassRecord], None]] = field(default_factory=list)


class Batcher:
    """S slots over one backend context; `submit()` from any thread, `step()` from one (or `start()` a thread)."""

    def __init__(
        self,
        ctx: BackendContext,
        prefill_chunk: int,
        budget: PassBudget | None = None,
        clock: Callable[[], float] = time.perf_counter,
        owns_context: bool = False,
        cache: PrefixCache | None = None,
        drafts: DraftSlots | None = None,
    ):
        self.ctx = ctx
        self.drafts = drafts  # the drafting rows' draft slots: one batched draft step a pass (None: each its own)
        self.cache = cache or PrefixCache(enabled=False)  # what finished rows leave in idle slots
        self.slots = ctx.batch
        self.capacity = ctx.capacity
        self.prefill_chunk = prefill_chunk
        self.budget = budget or PassBudget(prefill_tokens=max(prefill_chunk, 16))
        self.clock = clock
        self.rows: list[Row] = []  # active rows; rows[i].slot == i (packed)
        self.waiting: deque[Row] = deque()
        self.stats = BatcherStats()
        self._owns_context = owns_context
        self._wake = threading.Condition(threading.Lock())
        self._prefill_turn = True
        self._thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        backend: Backend,
        slots: int,
        capacity: int | None = None,
        prefill_chunk: int | None = None,
        budget: PassBudget | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cache: PrefixCache | None = None,
        draft: Backend | None = None,
    ) -> Batcher:
        """A batcher of `slots` rows of `capacity` entries each (default the backend's context) on a context of its own;
        with a `draft` backend of rows of their own, the drafting rows share its slots (runtime.draft_slots)."""
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise InputError(f"the batcher needs at least 1 slot (max batch), not {slots!r}")
        if slots > 1 and not backend.batched:
            raise BackendError(
                f"{slots} slots need rows of their own lengths (the in-place graph); the {backend.name} "
                "backend's contexts hold one row. Re-export the artifact (it adds model-inplace.onnx) "
                "and load it with graph='auto' or 'inplace' ('auto' keeps a level-4 artifact exported "
                "before the extra attention row on the portable graph), or run one slot"
            )
        limits = backend.limits
        capacity = min(capacity or limits.max_context, limits.max_context)
        return cls(
            backend.context(capacity, batch=slots),
            prefill_chunk or limits.prefill_chunk,
            budget,
            clock,
            owns_context=True,
            cache=cache,
            drafts=DraftSlots.open(draft, slots, capacity),
        )

    # -- any thread -------------------------------------------------------------------------------

    def submit(self, row: Row) -> Row:
        with self._wake:
            if self._closed:
                raise BackendError("the batcher is closed")
            self.waiting.append(row)
            self._wake.notify()
        return row

    def batches(self, row: Row, poll: float = 0.05) -> Iterator[list[int]]:
        """`row`'s committed tokens pass by pass as they come ([] every `poll` seconds while it waits, so the
        caller can stop); closing the iterator cancels the row. A row that failed raises its error at the end."""
        try:
            while True:
                try:
                    batch = row.tokens.get(timeout=poll)
                except queue.Empty:
                    yield []
                    continue
                if batch is END:
                    break
                yield batch
        finally:
            self.cancel(row)  # a no-op for a finished row; frees the slot of one stopped early
        if row.error is not None:
            raise row.error

    def cancel(self, row: Row) -> None:
        """Stop `row`: a waiting row is dropped, a running one frees its slot before the next pass."""
        with self._wake:
            row.cancelled.set()
            self._wake.notify()

    @property
    def running(self) -> int:
        return len(self.rows)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def start(self) -> Batcher:
        """Run passes on a background thread until close()."""
        self._thread = threading.Thread(target=self._loop, name="jacobi-rt-batcher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the loop; rows not finished fail (a cancelled one ends as cancelled); the context is closed if
        the batcher opened it."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self._drop_finished()  # a row stopped early (a stop string, a closed stream) still leaves its prefix
        for row in [*self.rows, *self.waiting]:
            if not row.finished and not row.cancelled.is_set():
                row.fail(BackendError("the batcher was closed before this generation ended"))
            self._release(row)
        self.rows, self.waiting = [], deque()
        if self._owns_context:
            self.cache.clear()
            self.ctx.close()
            if self.drafts is not None:
                self.drafts.close()

    # -- the loop's thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self.rows and not self.waiting:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:  # a failed pass fails its rows, never the loop
                for row in list(self.rows):
                    row.fail(exc)
                self._drop_finished()

    def step(self) -> PassRecord | None:
        """Admit and drop rows, then run one pass; None when there is nothing to run."""
        self._drop_finished()
        self._admit()
        if not self.rows:
            return None
        kind, span, width = self._schedule()
        record = self._run(kind, span, width)
        self._drop_finished()
        self.stats.passes += 1
        self.stats.rows += record.rows
        self.stats.tokens += record.tokens
        self.stats.last = record
        for observe in self.stats.observers:
            observe(record)
        return record

    def _admit(self) -> None:
        with self._wake:
            while self.waiting and len(self.rows) < self.slots:
                row = self.waiting.popleft()
                if row.cancelled.is_set():
                    self._release(row)
                    continue
                self._seat(row, len(self.rows))
                self.rows.append(row)
            for row in [r for r in self.waiting if r.cancelled.is_set()]:
                self.waiting.remove(row)
                self._release(row)

    def _seat(self, row: Row, slot: int) -> None:
        """Put `row` in `slot` (the first idle one), starting from the kept prefix its prompt shares, if any."""
        choice = self.cache.choose(row.prompt, range(slot, self.slots))
        if choice.place != slot:
            if choice.reuse:
                self.ctx.swap_rows(choice.place, slot)  # the hit comes down to where the rows are packed
            else:  # a free or evicted slot: only what `slot` keeps, if anything, needs to move
                self.ctx.move_row(slot, choice.place)
            self.cache.swap(choice.place, slot)
        self.ctx.trim_row(slot, choice.reuse)
        if self.drafts is not None:
            seat(self.drafts, row.proposer)
        if choice.kept is not None:
            row.proposer.adopt(choice.kept.proposer or {})  # the guesses travel with the prefix
        row.fed = row.cached = choice.reuse
        row.slot, row.admitted_at = slot, self.clock()

    def _drop_finished(self) -> None:
        """Free the slots of finished and cancelled rows, keeping what they cached (the prefix cache);
        pack the rest into the lowest slots."""
        for row in [r for r in self.rows if r.finished or r.cancelled.is_set()]:
            slot, last = row.slot, len(self.rows) - 1
            keep = self.cache.enabled and row.error is None
            home = self._parking(last) if keep else last  # where the finished row's cache stays
            if home != last:  # an idle slot above the rows: the cache moves there once, the last row comes down
                self.ctx.move_row(slot, home)
                if slot != last:
                    self.ctx.move_row(last, slot)
            elif slot != last:
                (self.ctx.swap_rows if keep else self.ctx.move_row)(last, slot)
            if slot != last:
                mover = self.rows[last]
                mover.slot = slot
                self.rows[slot] = mover
            self.rows.pop()
            row.slot = -1
            if keep:
                sequence = row.prompt[: row.fed] if row.prefilling else [*row.prompt, *row.generated]
                length = min(int(self.ctx.lengths[home]), len(sequence))  # past an EOS: entries no token names
                self.ctx.trim_row(home, length)
                self.cache.keep(home, sequence[:length], row.proposer.handover())
            else:
                self.ctx.trim_row(last, 0)
            self._release(row)

    def _parking(self, slot: int) -> int:
        """Where a finished row's cache is kept, out of the way of the next row (seated at `slot`): the highest
        never-used slot above, else the least recently kept one above (evicted now rather than at the next
        admission), so the copy is paid as a row ends, not in the next request's first token; `slot` itself
        when there is none above."""
        above = range(self.slots - 1, slot, -1)
        return self.cache.unused(above) if above else slot

    def _release(self, row: Row) -> None:
        if not row.progress.finish_reason and not row.error:
            row.progress.finish_reason = "cancelled"
        row.finished = True
        try:
            row.proposer.close()
        finally:
            row.tokens.put(END)

    def _schedule(self) -> tuple[str, range, int]:
        """The pass's kind, its rows (a range of slots) and its width."""
        lengths = self.ctx.lengths
        prefill = [r.slot for r in self.rows if r.prefilling]
        decode = [r.slot for r in self.rows if not r.prefilling]
        if prefill and (not decode or self._prefill_turn):
            self._prefill_turn = False
            first = min(prefill)
            needs = [len(r.prompt) - r.fed if r.prefilling else 0 for r in self.rows[first:]]
            count, width = self.budget.prefill_pass(needs, self.prefill_chunk)
            span = range(first, first + count)
            for s in decode:
                if s in span:
                    self.rows[s].bid(int(lengths[s]))
            return "prefill", span, width
        self._prefill_turn = True
        span = range(0, max(decode) + 1)
        width = self.budget.decode_window([self.rows[s].bid(int(lengths[s])) for s in decode])
        return "decode", span, width

    def _run(self, kind: str, span: range, width: int) -> PassRecord:
        before = self.ctx.lengths[span.start : span.stop].tolist()  # Python ints: numpy is slow on tiny arrays
        width = max(1, min(width, self.capacity - max(before)))
        rows = self.rows[span.start : span.stop]
        produce([want for row in rows if not row.prefilling for want in row.guess(width)])  # the draft step
        planned = [row.plan(width, length) for row, length in zip(rows, before)]
        ids, positions, mask = padded([(p.tokens, p.positions, p.mask) for p in planned])
        want_logits = any(p.logits for p in planned)
        self.ctx.select(span.start, span.stop)
        started = self.clock()
        out = self.ctx.forward(ids, positions, mask, want_logits=want_logits)
        seconds = self.clock() - started  # the one timing of the target's pass
        keeps, committed = [], 0
        for i, (row, plan) in enumerate(zip(rows, planned)):
            n = len(plan.tokens)
            try:
                keep = row.settle(
                    out.greedy_ids[i, :n], out.logits[i, :n] if want_logits else None, before[i], seconds, ids.shape
                )
            except Exception as exc:  # a proposer or sampler failing ends its own row only
                row.fail(exc)
                keep = []
            keeps.append(keep)
            committed += len(keep)
            row.session_seconds += seconds / len(rows)
            if row.first_token_at is None and not row.prefilling:
                row.first_token_at = self.clock()
                row.progress.prefill_seconds = row.first_token_at - row.admitted_at
        self.ctx.commit_each(keeps)
        self.budget.observe(ids.shape, seconds)
        return PassRecord(kind, len(rows), ids.shape[1], committed, seconds)


def run_alone(
    ctx: BackendContext,
    row: Row,
    prefill_chunk: int,
    budget: PassBudget | None = None,
    clock: Callable[[], float] = time.perf_counter,
    cache: PrefixCache | None = None,
) -> Iterator[list[int]]:
    """Run `row` alone on `ctx` (a one-row batch) in this thread: yield its committed tokens pass by pass
    ([] after each prompt chunk but the last), so the caller can stop between passes. Closing the
    iterator early ends the row (its proposer is closed); `ctx` stays its owner's. cache: what `ctx`'s
    row holds from an earlier call (the prefix cache); the row leaves its own in it."""
    batcher = Batcher(ctx, prefill_chunk, budget, clock, cache=cache)
    batcher.submit(row)
    try:
        while True:
            batcher.step()
            while not row.tokens.empty():
                batch = row.tokens.get_nowait()
                if batch is END:
                    if row.error is not None:
                        raise row.error
                    return
                yield batch
    finally:
        batcher.cancel(row)
        batcher.close()
