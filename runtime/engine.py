"""BatchEngine: continuous batching. Many generations share each target pass, one row (slot) each.

One in-place backend context holds S slots (rows of the fixed-capacity cache, each with its own
length). A loop (a background thread, or `step()` called directly) owns it; each pass:

    1. drop cancelled rows, admit waiting requests into free slots, keep the active rows packed in
       the lowest slots (the last one moves into a freed slot), so a pass runs rows [0, k) only;
    2. choose the pass: a prefill pass (rows still reading their prompt, chunks split by the budget)
       alternates with a decoding pass while both kinds of rows wait; the budget (runtime.scheduler)
       picks the decoding pass's window from the measured cost curve and the rows' acceptance;
    3. every row in the pass plans its window (a prompt chunk, or its last token + its proposer's
       guesses as a tree), rows are padded to one width (padding attends to itself only and is
       never committed), one forward runs, and each row commits its own accepted entries.

Rows join and leave between passes; a finished or cancelled row frees its slot at once. Each row
keeps its own strategy, proposer, sampler, limits and statistics; greedy rows read the in-graph
greedy ids, sampling rows their own logits. A row's tokens reach its caller through a queue.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .backends.base import Backend
from .decoding import Progress, _sampling, sampled_predictions
from .errors import BackendError, InputError
from .passes import pass_result
from .allocator import Offer, allocate
from .proposers import Proposer, observe_costs, own_cost
from .sampling import Sampler
from .scheduler import Bid, PassBudget
from .tree import Tree, build_tree
from .windows import AdaptiveWindow, FixedWindow

END = None  # what a row's queue carries after its last tokens


@dataclass
class Planned:
    """One row's part of a pass: window tokens, positions, mask, and what they are for."""

    tokens: list[int]
    positions: np.ndarray  # absolute positions [w]
    mask: np.ndarray  # bool [w, w]
    logits: bool  # the row samples from this pass's logits
    tree: Tree | None = None  # a decoding window (None: a prompt chunk)


class Row:
    """One generation inside the engine: its prompt, proposer, sampler, slot, and committed tokens."""

    def __init__(self, prompt: list[int], max_new_tokens: int, proposer: Proposer, sampler: Sampler,
                 window: int | FixedWindow | AdaptiveWindow, eos_ids: set[int], max_context: int):
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.proposer = proposer
        self.sampler = sampler
        self.policy = FixedWindow(window) if isinstance(window, int) else window
        self.eos_ids = eos_ids
        self.max_context = max_context
        self.progress = Progress()
        self.tokens: queue.Queue = queue.Queue()  # lists of committed tokens per pass ([] for a prompt chunk), then END
        self.slot = -1
        self.fed = 0  # prompt tokens in the cache
        self.last: int | None = None  # the last committed token (its KV not written yet); None while prefilling
        self.produced = 0
        self.history: list[int] | None = None  # with a sampler: prompt + every new token
        self.session_seconds = 0.0  # this row's share of the passes it took part in
        self.error: BaseException | None = None
        self.finished = False
        self.cancelled = threading.Event()
        self.submitted = self.first_token_at = None  # engine clock
        self._want = 1
        self._offer = Offer()  # the proposer's offer for the next pass
        self._planned: Planned | None = None

    @property
    def prefilling(self) -> bool:
        return self.last is None

    # -- before the pass --------------------------------------------------------------------------

    def bid(self, length: int) -> Bid:
        """What this row asks of its next decoding pass: the window its policy picks (within its limits)
        and its proposer's offer for it."""
        room = self.max_context - 1 - length
        self._want = max(1, min(self.policy.next(), self.max_new_tokens - self.produced, room))
        self._offer = self.proposer.offer(self._want - 1)
        return Bid(self._want, self._offer, own_cost(self.proposer))

    def plan(self, width: int, length: int) -> Planned:
        """This row's window of at most `width` tokens after its `length` cached entries."""
        if self.prefilling:
            piece = self.prompt[self.fed : self.fed + width]
            last_chunk = self.fed + len(piece) >= len(self.prompt)
            planned = Planned(piece, length + np.arange(len(piece), dtype=np.int64), _tril(len(piece)),
                              last_chunk and _sampling(self.sampler))
        else:
            w = min(self._want, width)
            guesses = self.proposer.take(allocate(self._offer, w - 1, own_cost(self.proposer)), w - 1)
            tree = build_tree(self.last, guesses, max_nodes=w)
            planned = Planned(tree.tokens, length + np.asarray(tree.positions, dtype=np.int64), tree.window_mask,
                              _sampling(self.sampler), tree)
        self._planned = planned
        return planned

    # -- after the pass ---------------------------------------------------------------------------

    def settle(self, greedy: np.ndarray, logits: np.ndarray | None, length: int, seconds: float,
               shape: tuple[int, int]) -> list[int]:
        """Read this row's predictions; return the window entries whose KV to keep. `length`: the
        row's cached entries before the pass; `seconds`: the pass's forward; `shape`: its (rows, width)."""
        planned, self._planned = self._planned, None
        if planned.tree is None:
            return self._settle_prefill(planned, greedy, logits)
        tree = planned.tree
        if _sampling(self.sampler):
            predictions = sampled_predictions(self.sampler, logits, tree.tokens, tree.parents, self.history)
        else:
            predictions = greedy.tolist()
        verdict = tree.accept(predictions)
        if _sampling(self.sampler):
            for entry, token in zip(verdict.keep, verdict.committed):
                self.sampler.record(logits[entry], token)
            self.history += verdict.committed
        result = pass_result(tree, predictions, verdict, seconds, *shape)
        observe_costs(self.proposer, result)
        self.proposer.update(result)
        new = verdict.committed
        self.policy.observe(result)
        self.last = new[-1]
        self.produced += len(new)
        self.progress.target_passes += 1
        self.progress.accepted += len(new)
        self._emit(new, length + len(verdict.keep))
        return verdict.keep

    def _settle_prefill(self, planned: Planned, greedy: np.ndarray, logits: np.ndarray | None) -> list[int]:
        n = len(planned.tokens)
        self.fed += n
        self.progress.prefill_passes += 1
        if self.fed < len(self.prompt):
            self.tokens.put([])
            return list(range(n))
        if _sampling(self.sampler):
            first = self.sampler.sample(logits[n - 1], self.prompt, len(self.prompt))
            self.sampler.record(logits[n - 1], first)
            self.history = [*self.prompt, first]
        else:
            first = int(greedy[n - 1])
        self.proposer.use_sampler(self.sampler if _sampling(self.sampler) else None)
        self.proposer.start(self.prompt, first)
        self.last = first
        self.produced = 1
        self._emit([first], len(self.prompt))
        return list(range(n))

    def _emit(self, new: list[int], length: int) -> None:
        """Send the pass's tokens; finish on EOS, max_new_tokens or the context limit (as decoding.decode)."""
        cut = next((i for i, t in enumerate(new) if t in self.eos_ids), None)
        if cut is not None:
            self.progress.accepted -= len(new) - cut - 1  # tokens after the EOS are dropped
            self.tokens.put(new[: cut + 1])
            self.progress.finish_reason = "eos"
        else:
            self.tokens.put(new)
            if self.produced >= self.max_new_tokens:
                self.progress.finish_reason = "length"
            elif self.max_context - 1 - length < 1:
                self.progress.finish_reason = "context"
        if self.progress.finish_reason:
            self.finished = True

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finished = True


@dataclass
class PassRecord:
    """What one engine pass did (for metrics and tests)."""

    kind: str  # "prefill" or "decode"
    rows: int  # rows in the pass (padding rows of idle slots included)
    window: int  # the pass's width
    tokens: int  # tokens committed (prompt chunks included)
    seconds: float


@dataclass
class EngineStats:
    passes: int = 0
    rows: int = 0  # sum over passes
    tokens: int = 0
    last: PassRecord | None = None
    observers: list[Callable[[PassRecord], None]] = field(default_factory=list)


class BatchEngine:
    """S slots over one in-place context; `submit()` from any thread, `step()` from one (or `start()` a thread)."""

    def __init__(self, backend: Backend, slots: int, capacity: int | None = None, prefill_chunk: int | None = None,
                 budget: PassBudget | None = None, clock: Callable[[], float] = time.perf_counter):
        if not isinstance(slots, int) or slots < 1:
            raise InputError(f"the engine needs at least 1 slot (max batch), not {slots!r}")
        limits = backend.limits
        self.capacity = min(capacity or limits.max_context, limits.max_context)
        self.ctx = backend.context(self.capacity, batch=slots)
        if not hasattr(self.ctx, "select"):
            self.ctx.close()
            raise BackendError(f"continuous batching needs the in-place graph (rows with their own lengths); the "
                               f"{backend.name} backend opened {type(self.ctx).__name__}: re-export the artifact "
                               "(it adds model-inplace.onnx) and load it with graph='auto' or 'inplace'; 'auto' keeps "
                               "weights quantized at accuracy level 4 on the portable graph (faster for one sequence): "
                               "load those with graph='inplace' (exact when re-exported with this jacobi-rt, which gives "
                               "their attention an extra row)")
        self.slots = slots
        self.prefill_chunk = prefill_chunk or limits.prefill_chunk
        self.budget = budget or PassBudget(prefill_tokens=max(self.prefill_chunk, 16))
        self.clock = clock
        self.rows: list[Row] = []  # active rows; rows[i].slot == i (packed)
        self.waiting: deque[Row] = deque()
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._prefill_turn = True
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- any thread -------------------------------------------------------------------------------

    def submit(self, row: Row) -> Row:
        with self._wake:
            if self._closed:
                raise BackendError("the batch engine is closed")
            row.submitted = self.clock()
            self.waiting.append(row)
            self._wake.notify()
        return row

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

    def start(self) -> "BatchEngine":
        """Run passes on a background thread until close()."""
        self._thread = threading.Thread(target=self._loop, name="jacobi-rt-engine", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        for row in [*self.rows, *self.waiting]:
            if not row.finished:
                row.fail(BackendError("the batch engine was closed before this generation ended"))
            self._release(row)
        self.rows, self.waiting = [], deque()
        self.ctx.close()

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
        kind, span, width = self._choose()
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
        with self._lock:
            while self.waiting and len(self.rows) < self.slots:
                row = self.waiting.popleft()
                if row.cancelled.is_set():
                    self._release(row)
                    continue
                row.slot = len(self.rows)
                self.ctx.lengths[row.slot] = 0
                self.rows.append(row)
            for row in [r for r in self.waiting if r.cancelled.is_set()]:
                self.waiting.remove(row)
                self._release(row)

    def _drop_finished(self) -> None:
        """Free the slots of finished and cancelled rows; pack the rest into the lowest slots."""
        for row in [r for r in self.rows if r.finished or r.cancelled.is_set()]:
            slot, last = row.slot, len(self.rows) - 1
            if slot != last:
                mover = self.rows[last]
                self.ctx.move_row(last, slot)
                mover.slot = slot
                self.rows[slot] = mover
            else:
                self.ctx.lengths[slot] = 0
            self.rows.pop()
            row.slot = -1
            self._release(row)

    def _release(self, row: Row) -> None:
        if not row.progress.finish_reason and not row.error:
            row.progress.finish_reason = "cancelled"
        row.finished = True
        try:
            row.proposer.close()
        finally:
            row.tokens.put(END)

    def _choose(self) -> tuple[str, range, int]:
        """The pass's kind, its rows (a range of slots) and its width."""
        prefill = [r.slot for r in self.rows if r.prefilling]
        decode = [r.slot for r in self.rows if not r.prefilling]
        lengths = self.ctx.lengths
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
        lengths = self.ctx.lengths
        width = max(1, min(width, self.capacity - int(lengths[span.start : span.stop].max())))
        rows = [self.rows[s] for s in span]
        planned = [row.plan(width, int(lengths[row.slot])) for row in rows]
        ids, positions, mask = _pad(planned)
        want_logits = any(p.logits for p in planned)
        before = lengths[span.start : span.stop].copy()
        self.ctx.select(span.start, span.stop)
        started = self.clock()
        out = self.ctx.forward(ids, positions, mask, want_logits=want_logits)
        seconds = self.clock() - started
        keeps, committed = [], 0
        for i, (row, plan) in enumerate(zip(rows, planned)):
            n = len(plan.tokens)
            try:
                keep = row.settle(out.greedy_ids[i, :n], out.logits[i, :n] if want_logits else None, int(before[i]), seconds,
                                  ids.shape)
            except Exception as exc:  # a proposer or sampler failing ends its own row only
                row.fail(exc)
                keep = []
            keeps.append(keep)
            committed += len(keep)
            row.session_seconds += seconds / len(rows)
            if row.first_token_at is None and not row.prefilling:
                row.first_token_at = self.clock()
        self.ctx.commit_each(keeps)
        self.budget.observe(ids.shape, seconds)
        return PassRecord(kind, len(rows), ids.shape[1], committed, seconds)


def _pad(planned: list[Planned]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows padded to the widest: padding repeats the row's last token and position and attends to itself only."""
    k, width = len(planned), max(len(p.tokens) for p in planned)
    ids = np.empty((k, width), dtype=np.int64)
    positions = np.empty((k, width), dtype=np.int64)
    mask = np.zeros((k, width, width), dtype=bool)
    mask[:, np.arange(width), np.arange(width)] = True
    for i, p in enumerate(planned):
        n = len(p.tokens)
        ids[i, :n], ids[i, n:] = p.tokens, p.tokens[-1]
        positions[i, :n], positions[i, n:] = p.positions, p.positions[-1]
        mask[i, :n, :n] = p.mask
    return ids, positions, mask


_TRIL = np.tril(np.ones((512, 512), dtype=bool))


def _tril(n: int) -> np.ndarray:
    return _TRIL[:n, :n] if n <= 512 else np.tril(np.ones((n, n), dtype=bool))
