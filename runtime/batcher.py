"""The batcher: the one decoding loop, for a lone generation (a batch of one row) and for many.

One backend context holds S slots (rows of the cache, each with its own length; a context of the
portable graph or TensorRT holds one). Each `step()` is one target pass:

    1. drop finished and cancelled rows (their slots keep what they cached: runtime.prefix_cache),
       admit waiting ones, each seated on the idle slot holding the longest prefix of its prompt, and
       keep the active rows packed in the lowest slots, so a pass runs rows [0, k);
    2. choose the pass: a prefill pass (rows still reading their prompt, chunks split by the budget)
       alternates with a decoding pass while both kinds of rows wait; the budget (runtime.scheduler)
       picks the decoding pass's width from the measured cost curve and the rows' offers;
    3. plan: every row in the pass builds its window (a prompt chunk, or its last token + the guesses
       the allocator sent as a tree); rows are padded to one width (padding attends to itself only and
       is never committed);
    4. one forward, timed here and nowhere else;
    5. accept and commit: each row reads its predictions (the in-graph greedy ids, or its sampler on its
       own logits), walks its tree, keeps its own entries, and hands its proposer the one PassResult.

A lone `Generator.generate()` runs `run_alone` in the caller's thread; `Generator.start_batching()` runs
`Batcher.start()`'s thread for every caller. Every committed token is the target's own prediction
given its prefix, so each row equals its own one-token decoding (greedy, or seeded sampling).

A constrained row (structured output, runtime/constraints.py) offers the tokens its grammar forces as a
guess right with chance 1, its proposer guessing past them as if they were committed (every guess cut
to the grammar), masks each node's pick with the grammar's state after that node's prefix, and asks for
logits; its pick at each node is one-token constrained decoding's, so it stays exact too.

A pass, one row, lookahead (last committed token "a", a guess "b c d" and a side branch "b e"):

    window   a  b  c  d  e       positions  L  L+1 L+2 L+3 L+2     (L: the row's length)
    mask     a: a                predictions    b   c   x   .   .  (the target's pick at each node)
             b: a b              accept: b (= pick at a), c (= pick at b); x is the pick at c, not d:
             c: a b c            committed b c x, KV kept for a b c (a prefix: a length update)
             d: a b c d
             e: a b    e
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .allocator import allocate
from .backends.base import Backend, BackendContext, lower_triangular, padded
from .constraints import ConstrainedOffer, Masks, Matcher
from .draft_slots import DraftSlots
from .errors import BackendError, InputError
from .passes import pass_result
from .prefix_cache import PrefixCache
from .proposers import Proposer, close_state, observe_costs, own_cost
from .sampling import Sampler, SamplingParams, masked_greedy
from .scheduler import Bid, PassBudget
from .tree import Tree, build_tree
from .windows import AdaptiveWindow, FixedWindow

END = None  # what a row's queue carries after its last tokens


@dataclass
class Progress:
    """What a row's generation did, filled in as it runs."""

    prefill_passes: int = 0
    prefill_seconds: float = 0.0  # from admission to the first token
    target_passes: int = 0  # decoding passes, prefill not included
    accepted: int = 0  # tokens committed by decoding passes (the prefill's token not included)
    finish_reason: str = ""  # "eos", "length" (max_new_tokens), "context" (max_context), "cancelled"; "stop" is the caller's


@dataclass
class Planned:
    """One row's part of a pass: window tokens, positions, mask, and what they are for."""

    tokens: list[int]
    positions: np.ndarray  # absolute positions [w]
    mask: np.ndarray  # bool [w, w]
    logits: bool  # the row samples (or picks under a constraint) from this pass's logits
    tree: Tree | None = None  # a decoding window (None: a prompt chunk)
    masks: Masks | None = None  # a constrained row's masks for the window


class Row:
    """One generation: its prompt, proposer, sampler, limits, slot, and committed tokens (`tokens`: a queue
    of each pass's committed tokens, [] for a prompt chunk, then END). `matcher`: the grammar the output
    must follow (runtime.constraints; None: free text)."""

    def __init__(self, prompt: list[int], max_new_tokens: int, proposer: Proposer, sampler: Sampler | None,
                 window: int | FixedWindow | AdaptiveWindow, eos_ids: set[int], max_context: int,
                 matcher: Matcher | None = None):
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.proposer = proposer
        self.sampler = sampler or Sampler(SamplingParams(), len(prompt))
        self.sampling = not self.sampler.params.greedy  # logits reach the host and the sampler picks
        self.matcher = matcher
        self.wants_logits = self.sampling or matcher is not None  # a constrained pick may not be the in-graph one
        self.policy = FixedWindow(window) if isinstance(window, int) else window
        self.eos_ids = eos_ids
        self.max_context = max_context
        self.progress = Progress()
        self.tokens: queue.Queue = queue.Queue()
        self.slot = -1
        self.fed = 0  # prompt tokens in the cache
        self.last: int | None = None  # the last committed token (its KV not written yet); None while prefilling
        self.produced = 0
        self.generated: list[int] = []  # the committed new tokens (an EOS's followers dropped)
        self.cached = 0  # prompt tokens whose KV the prefix cache gave (not prefilled)
        self.history: list[int] | None = None  # when sampling: prompt + every new token
        self.session_seconds = 0.0  # this row's share of the forwards it took part in
        self.error: BaseException | None = None
        self.finished = False
        self.cancelled = threading.Event()
        self.admitted_at = self.first_token_at = None  # batcher clock
        self._bid: Bid | None = None  # for the next pass (a constrained row's offer: with the forced run)
        self._constrained: ConstrainedOffer | None = None  # where a constrained offer's guesses came from
        self._forced_nodes = 0  # of the planned window: the forced run's nodes (1..F)
        self._guesses: tuple[list[int], list[list[int]]] = ([], [])  # the forced run, the proposer's guesses (guess)
        self._planned: Planned | None = None

    @property
    def prefilling(self) -> bool:
        return self.last is None

    # -- before the pass --------------------------------------------------------------------------

    def bid(self, length: int) -> Bid:
        """What this row asks of its next decoding pass: the window its policy picks, within max_new_tokens
        and the context (the new last token sits at `length`; a pass of w predicts up to length + w), and
        its proposer's offer for it."""
        room = self.max_context - 1 - length
        want = max(1, min(self.policy.next(), self.max_new_tokens - self.produced, room))
        # under a grammar, the forced run as a sure guess, the proposer guessing past it; every guess cut to the grammar
        forced = self.matcher.forced(want - 1) if self.matcher is not None and want > 1 else []
        offer = self.proposer.offer(want - 1 - len(forced), after=forced)
        if self.matcher is not None:
            self._constrained = self.matcher.constrain(offer, forced)
            offer = self._constrained.offer
        self._bid = Bid(want, offer, own_cost(self.proposer))
        return self._bid

    def guess(self, width: int) -> None:
        """A decoding row's guesses for a pass `width` wide: its offer cut by the allocator, taken from its
        proposer (a seated draft's chain is filled by the batcher's draft step before `plan`)."""
        w = min(self._bid.want, width)
        allocation = allocate(self._bid.offer, w - 1, self._bid.cost)
        forced, own = ([], allocation) if self.matcher is None else self._constrained.split(allocation)
        self._guesses = forced, self.proposer.take(own, w - 1 - len(forced))

    def plan(self, width: int, length: int) -> Planned:
        """This row's window of at most `width` tokens after its `length` cached entries (after `guess`)."""
        if self.prefilling:
            piece = self.prompt[self.fed : self.fed + width]
            last_chunk = self.fed + len(piece) >= len(self.prompt)
            planned = Planned(piece, length + np.arange(len(piece), dtype=np.int64), lower_triangular(len(piece)),
                              last_chunk and self.wants_logits)
        else:
            w = min(self._bid.want, width)
            forced, guesses = self._guesses
            if self.matcher is not None:  # each guess continues the forced run; a draft's chain is cut here
                guesses = [g[: self.matcher.cut(g)] for g in ([*forced, *g] for g in guesses)] or [forced]
            tree, masks = build_tree(self.last, guesses, max_nodes=w), None
            if self.matcher is not None:
                masks = self.matcher.masks(tree.tokens, tree.parents)
                self._forced_nodes = min(len(forced), w - 1)  # nodes 1..F: the forced run, the tree's first chain
                self.matcher.cost.forced_sent += self._forced_nodes
                if forced:
                    self.matcher.cost.past_forced_sent += len(tree.tokens) - 1 - self._forced_nodes
            planned = Planned(tree.tokens, length + np.asarray(tree.positions, dtype=np.int64), tree.window_mask,
                              self.wants_logits, tree, masks)
        self._planned = planned
        return planned

    # -- after the pass ---------------------------------------------------------------------------

    def settle(self, greedy: np.ndarray, logits: np.ndarray | None, length: int, seconds: float,
               shape: tuple[int, int]) -> list[int]:
        """Accept and commit this row's part of the pass; return the window entries whose KV to keep.
        `length`: the row's cached entries before the pass; `seconds`: the forward; `shape`: its (rows, width)."""
        planned, self._planned = self._planned, None
        if planned.tree is None:
            return self._settle_prefill(planned, greedy, logits)
        tree = planned.tree
        predictions = self._picks(greedy, logits, tree.tokens, tree.parents, planned.masks)
        verdict = tree.accept(predictions)  # the walk down the target's own predictions
        if self.sampling:
            for entry, token in zip(verdict.keep, verdict.committed):
                self.sampler.record(logits[entry], token)
            self.history += verdict.committed
        result = pass_result(tree, predictions, verdict, seconds, *shape)
        observe_costs(self.proposer, result)  # the loop teaches the cost curves, once per pass
        self.proposer.update(result)
        self.policy.observe(result)
        new = verdict.committed
        if self.matcher is not None:
            new = self._constrained_commit(new, verdict.path)
        self.progress.target_passes += 1
        self.progress.accepted += len(new)
        self._emit(new, length + len(verdict.keep))
        return verdict.keep

    def _settle_prefill(self, planned: Planned, greedy: np.ndarray, logits: np.ndarray | None) -> list[int]:
        n = len(planned.tokens)
        self.fed += n
        self.progress.prefill_passes += 1
        if self.fed < len(self.prompt):
            self.tokens.put([])  # the caller gets control between prefill passes
            return list(range(n))
        masks = None if self.matcher is None else self.matcher.masks([self.prompt[-1]], [-1])
        self.history = list(self.prompt) if self.sampling else None
        last = slice(n - 1, n)  # the pick after the prompt's last token
        first = self._picks(greedy[last], logits if logits is None else logits[last], [self.prompt[-1]], [-1], masks)[0]
        if self.sampling:
            self.sampler.record(logits[n - 1], first)
            self.history.append(first)
        self.proposer.use_sampler(self.sampler if self.sampling else None)
        self.proposer.start(self.prompt, first)
        new = [first] if self.matcher is None else self._constrained_commit([first], [])
        self._emit(new, len(self.prompt))
        return list(range(n))

    def _picks(self, greedy: np.ndarray, logits: np.ndarray | None, tokens: list[int], parents: list[int],
               masks: Masks | None) -> list[int]:
        """The target's pick at each window node: the in-graph greedy id, or the sampler's, node i's prefix being the
        history and its ancestors' tokens below the root plus its own, at position len(history) + depth (the root is
        history[-1]); under a constraint, among the tokens each live node's mask allows (constrained greedy reads
        the logits only where the mask refuses the greedy id; a dead node, never reached, keeps it)."""
        if not self.sampling and masks is None:
            return greedy.tolist()
        if not self.sampling:
            return [g if not masks.live[i] or masks.allows(i, g) else masked_greedy(logits[i], g, masks.allowed(i))
                    for i, g in enumerate(greedy.tolist())]
        paths: list[list[int]] = []
        picks = []
        for node, parent in enumerate(parents):
            paths.append([] if parent < 0 else [*paths[parent], tokens[node]])
            prefix = self.history + paths[-1]
            allowed = (masks.allowed(node),) if masks is not None and masks.live[node] else ()
            picks.append(self.sampler.sample(logits[node], prefix, len(prefix), *allowed))
        return picks

    def _constrained_commit(self, new: list[int], path: list[int]) -> list[int]:
        """Advance the grammar past the committed tokens (through the first EOS). Where the grammar then
        allows nothing but the one EOS, that EOS is committed now, without a pass (the pick a pass would
        make; not when logprobs are recorded, which need its logits)."""
        cut = next((i for i, t in enumerate(new) if t in self.eos_ids), len(new) - 1)
        new = new[: cut + 1]
        self.matcher.commit(new)
        self.matcher.cost.forced_committed += sum(1 for node in path if node <= self._forced_nodes)
        m = self.matcher
        if (m.finished and not m.ended and len(self.eos_ids) == 1 and self.produced + len(new) < self.max_new_tokens
                and self.sampler.params.logprobs is None):
            eos = next(iter(self.eos_ids))
            m.commit([eos])
            new = [*new, eos]
            if self.history is not None:
                self.history.append(eos)
        return new

    def _emit(self, new: list[int], length: int) -> None:
        """Send the pass's tokens; finish on EOS (tokens after it are dropped), max_new_tokens or the context."""
        self.last = new[-1]
        self.produced += len(new)
        end = next((i + 1 for i, t in enumerate(new) if t in self.eos_ids), None)
        if end is not None:
            self.progress.accepted -= len(new) - end
            new = new[:end]
            self.progress.finish_reason = "eos"
        elif self.produced >= self.max_new_tokens:
            self.progress.finish_reason = "length"
        elif self.max_context - 1 - length < 1:
            self.progress.finish_reason = "context"
        self.generated += new
        self.tokens.put(new)
        if self.progress.finish_reason:
            self.finished = True

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finished = True


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

    def __init__(self, ctx: BackendContext, prefill_chunk: int, budget: PassBudget | None = None,
                 clock: Callable[[], float] = time.perf_counter, owns_context: bool = False,
                 cache: PrefixCache | None = None, drafts: DraftSlots | None = None):
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
    def open(cls, backend: Backend, slots: int, capacity: int | None = None, prefill_chunk: int | None = None,
             budget: PassBudget | None = None, clock: Callable[[], float] = time.perf_counter,
             cache: PrefixCache | None = None, draft: Backend | None = None) -> "Batcher":
        """A batcher of `slots` rows of `capacity` entries each (default the backend's context) on a context of its own;
        with a `draft` backend of rows of their own, the drafting rows share its slots (runtime.draft_slots)."""
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise InputError(f"the batcher needs at least 1 slot (max batch), not {slots!r}")
        if slots > 1 and not backend.batched:
            raise BackendError(f"{slots} slots need rows of their own lengths (the in-place graph); the {backend.name} "
                               "backend's contexts hold one row. Re-export the artifact (it adds model-inplace.onnx) "
                               "and load it with graph='auto' or 'inplace' ('auto' keeps a level-4 artifact exported "
                               "before the extra attention row on the portable graph), or run one slot")
        limits = backend.limits
        capacity = min(capacity or limits.max_context, limits.max_context)
        return cls(backend.context(capacity, batch=slots), prefill_chunk or limits.prefill_chunk, budget, clock,
                   owns_context=True, cache=cache, drafts=DraftSlots.open(draft, slots, capacity))

    # -- any thread -------------------------------------------------------------------------------

    def submit(self, row: Row) -> Row:
        with self._wake:
            if self._closed:
                raise BackendError("the batcher is closed")
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

    def start(self) -> "Batcher":
        """Run passes on a background thread until close()."""
        self._thread = threading.Thread(target=self._loop, name="jacobi-rt-batcher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the loop; rows not finished fail (a cancelled one ends as cancelled); the context is closed if the batcher opened it."""
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
            for kept in self.cache.clear():
                close_state(kept.proposer)
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
        if choice.slot != slot:
            if choice.reuse:
                self.ctx.swap_rows(choice.slot, slot)  # the hit comes down to where the rows are packed
            else:  # a free or evicted slot: only what `slot` keeps, if anything, needs to move
                self.ctx.move_row(slot, choice.slot)
            self.cache.swap(choice.slot, slot)
        self.ctx.trim_row(slot, choice.reuse)
        if self.drafts is not None:
            self.drafts.seat(row.proposer)
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
        if not above:
            return slot
        free = [s for s in above if s not in self.cache.kept]
        return free[0] if free else self.cache.evict(above)

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
        for row in rows:
            if not row.prefilling:
                row.guess(width)
        if self.drafts is not None:
            self.drafts.run()  # every seated draft's chain, in one batched draft step
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
                keep = row.settle(out.greedy_ids[i, :n], out.logits[i, :n] if want_logits else None, before[i],
                                  seconds, ids.shape)
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


def run_alone(ctx: BackendContext, row: Row, prefill_chunk: int, budget: PassBudget | None = None,
              clock: Callable[[], float] = time.perf_counter, cache: PrefixCache | None = None) -> Iterator[list[int]]:
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
