"""Row: one generation in the batcher, from its prompt to its last committed token.

A row plans its part of each pass (a prompt chunk, or its last token + the guesses the allocator sent,
as a tree), then settles it: reads its picks (the in-graph greedy ids, or its sampler on its own
logits), walks its tree, and hands its proposer the one PassResult (`observe`). Every committed token is the
target's own prediction given its prefix, so a row equals its own one-token decoding.

A row's output stage (runtime/structured.py) acts before and after each pass: for structured output it
prepends the tokens its grammar forces as a sure guess, cuts every guess to the grammar and masks each
node's pick; the row only calls its hooks (free text: each leaves things as they are).

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
from dataclasses import dataclass

import numpy as np

from .allocator import Allocation, Offer, allocate, produced, sent_guesses
from .backends.base import lower_triangular
from .grammar import Masks
from .pass_budget import Bid
from .passes import pass_result
from .proposers import Proposer, observe_costs, own_cost
from .request import Request
from .sampling import Sampler, SamplingParams, TokenLogprob, masked_greedy
from .structured import GrammarStage, OutputStage
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
    finish_reason: str = (
        ""  # "eos", "length" (max_new_tokens), "context" (max_context), "cancelled"; "stop" is the caller's
    )


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
    of each pass's committed tokens, [] for a prompt chunk, then END). `stage`: what shapes its output
    around each pass (runtime.structured; None: free text)."""

    def __init__(
        self,
        prompt: list[int],
        max_new_tokens: int,
        proposer: Proposer,
        sampler: Sampler | None,
        window: int | FixedWindow | AdaptiveWindow,
        eos_ids: set[int],
        max_context: int,
        stage: OutputStage | None = None,
    ):
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.proposer = proposer
        self.sampler = sampler or Sampler(SamplingParams(), len(prompt))
        self.sampling = not self.sampler.params.greedy  # logits reach the host and the sampler picks
        self.stage = stage or OutputStage()
        self.wants_logits = self.sampling or self.stage.wants_logits
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
        self._bid: Bid | None = None  # for the next pass (under a grammar: with the forced run)
        self._offer = Offer()  # the proposer's own offer for it (past the forced run)
        self._sent: tuple[list[int], Allocation] = ([], Allocation([]))  # the forced run sent, the proposer's share
        self._planned: Planned | None = None

    @classmethod
    def of(cls, request: Request, proposer: Proposer, eos_ids: set[int], max_context: int) -> Row:
        """The row that runs a resolved request: its sampler, its output stage (a grammar's, or free text), and
        its window policy (adaptive between 1 and the window for plain Jacobi without a window, else fixed)."""
        logprobs = request.sampling.logprobs is not None
        stage = None if request.matcher is None else GrammarStage(request.matcher, eos_ids, logprobs)
        config = request.config.jacobi
        policy = AdaptiveWindow(request.window, config) if request.adaptive else FixedWindow(request.window)
        sampler = Sampler(request.sampling, len(request.prompt_ids))
        return cls(request.prompt_ids, request.max_new_tokens, proposer, sampler, policy, eos_ids, max_context, stage)

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
        forced = self.stage.forced(want)  # a sure guess; the proposer guesses past it
        self._offer = self.proposer.offer(want - 1 - len(forced), after=forced)
        self._bid = Bid(want, self.stage.offer(self._offer, forced), own_cost(self.proposer))
        return self._bid

    def guess(self, width: int) -> list[tuple[Proposer, int]]:
        """A decoding row's guesses for a pass `width` wide: its offer cut by the allocator. Returns the
        chains still to produce, (producer, tokens): the batcher's draft step makes them before `plan`."""
        w = min(self._bid.want, width)
        forced, own = self._sent = self.stage.split(allocate(self._bid.offer, w - 1, self._bid.cost))
        return produced(self._offer, own)

    def plan(self, width: int, length: int) -> Planned:
        """This row's window of at most `width` tokens after its `length` cached entries (after `guess`)."""
        if self.prefilling:
            piece = self.prompt[self.fed : self.fed + width]
            last_chunk = self.fed + len(piece) >= len(self.prompt)
            planned = Planned(
                piece,
                length + np.arange(len(piece), dtype=np.int64),
                lower_triangular(len(piece)),
                last_chunk and self.wants_logits,
            )
        else:
            w = min(self._bid.want, width)
            forced, own = self._sent
            tree = build_tree(self.last, self.stage.guesses(forced, sent_guesses(self._offer, own)), max_nodes=w)
            masks = self.stage.masks(tree, forced)
            planned = Planned(
                tree.tokens,
                length + np.asarray(tree.positions, dtype=np.int64),
                tree.window_mask,
                self.wants_logits,
                tree,
                masks,
            )
        self._planned = planned
        return planned

    # -- after the pass ---------------------------------------------------------------------------

    def settle(
        self, greedy: np.ndarray, logits: np.ndarray | None, length: int, seconds: float, shape: tuple[int, int]
    ) -> list[int]:
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
        result = pass_result(tree, predictions, verdict, seconds, *shape, sent=self._sent[1])
        observe_costs(self.proposer, result)  # the loop teaches the cost curves, once per pass
        self.proposer.observe(result)
        self.policy.observe(result)
        new = self.stage.commit(verdict.committed, verdict.path, self.max_new_tokens - self.produced)
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
        masks = self.stage.first_masks(self.prompt[-1])
        self.history = list(self.prompt) if self.sampling else None
        last = slice(n - 1, n)  # the pick after the prompt's last token
        first = self._picks(greedy[last], logits if logits is None else logits[last], [self.prompt[-1]], [-1], masks)[0]
        if self.sampling:
            self.sampler.record(logits[n - 1], first)
        self.proposer.use_sampler(self.sampler if self.sampling else None)
        self.proposer.start(self.prompt, first)
        new = self.stage.commit([first], [], self.max_new_tokens - self.produced)
        self._emit(new, len(self.prompt))
        return list(range(n))

    def _picks(
        self, greedy: np.ndarray, logits: np.ndarray | None, tokens: list[int], parents: list[int], masks: Masks | None
    ) -> list[int]:
        """The target's pick at each window node: the in-graph greedy id, or the sampler's, node i's prefix being the
        history and its ancestors' tokens below the root plus its own, at position len(history) + depth (the root is
        history[-1]); under a constraint, among the tokens each live node's mask allows (constrained greedy reads
        the logits only where the mask refuses the greedy id; a dead node, never reached, keeps it)."""
        if not self.sampling and masks is None:
            return greedy.tolist()
        if not self.sampling:
            return [
                g if not masks.live[i] or masks.allows(i, g) else masked_greedy(logits[i], g, masks.allowed(i))
                for i, g in enumerate(greedy.tolist())
            ]
        paths: list[list[int]] = []
        picks = []
        for node, parent in enumerate(parents):
            paths.append([] if parent < 0 else [*paths[parent], tokens[node]])
            prefix = self.history + paths[-1]
            allowed = (masks.allowed(node),) if masks is not None and masks.live[node] else ()
            picks.append(self.sampler.sample(logits[node], prefix, len(prefix), *allowed))
        return picks

    def _emit(self, new: list[int], length: int) -> None:
        """Send the pass's tokens; finish on EOS (tokens after it are dropped), max_new_tokens or the context."""
        if self.sampling:
            self.history += new
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

    def outcome(self) -> RowOutcome:
        sampling = self.sampler.params
        return RowOutcome(
            self.progress,
            self.session_seconds,
            dict(self.proposer.stats),
            self.cached,
            self.sampler.logprobs,
            sampling.seed if sampling.sampled else None,
            self.stage.stats(),
        )


@dataclass
class RowOutcome:
    """What a row did, for its caller's result: read from the row, never its internals."""

    progress: Progress
    session_seconds: float  # its share of the forwards it took part in
    proposer: dict  # the proposer's counters
    cached: int  # prompt tokens whose KV the prefix cache gave
    logprobs: list[TokenLogprob]  # one per sampled or recorded token (empty unless asked)
    seed: int | None  # the sampling seed; None when decoding greedily
    constraint: dict | None  # a constrained output's mask cost and forced tokens; None for free text
