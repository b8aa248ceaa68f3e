"""Proposers fill a window's guesses. They see token ids only.

The protocol is two calls a pass. `offer(limit)` proposes ranked candidate continuations of the
committed sequence with their per-token acceptance estimates (runtime.allocator.Offer); the allocator
chooses how much of each the row sends (a draft's chain is then produced at its length by the
batcher's draft step, runtime.draft.produce), the target verifies them all in one pass as a tree
(runtime.tree), and `observe(result)` hands the proposer the pass's PassResult (runtime.passes: the
tree, what the target predicted and committed, the forward's measured seconds, and the allocation of
its offer that was sent), so a proposer can keep state (the Jacobi trajectory, an n-gram pool, a
draft model's cache) and learn the pass's cost without timing it.

Under a grammar (structured output) the window starts with the tokens the grammar forces; the loop
asks `offer(limit, after=forced)`, and the proposer guesses past them as if they were committed
(its guesses, taken and scored, are the tokens after the run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace

from .acceptance import AcceptanceTracker, PassCosts
from .allocator import Allocation, Guess, Offer
from .config import DEFAULTS, CostConfig
from .ngram import Candidate, NgramPool, PromptLookup
from .passes import PassResult
from .tree import leaf_paths


class Proposer(ABC):
    stats: dict  # counters merged into the generation's statistics
    # Seconds its own model spent feeding tokens the proposer had not seen yet (a draft's prefill, or its
    # catch-up after sitting out): paid once, not per pass, so `auto` leaves it out of per-pass rates.
    catchup_seconds: float = 0.0

    def __init__(self) -> None:
        self.stats = {}

    @abstractmethod
    def start(self, prompt: list[int], first: int) -> None:
        """A new sequence: the prompt, and the first token the prefill produced."""

    @abstractmethod
    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        """Ranked guesses for the next pass, at most `limit` tokens each, with their acceptance estimates
        (the allocator cuts them). `after`: tokens the pass sends first whatever is guessed (a grammar's
        forced run): the guesses continue them, and `observe` reads this pass that way."""

    @abstractmethod
    def observe(self, result: PassResult) -> None:
        """The target saw result.tree, predicted result.predictions (one per node), and committed
        result.committed in a forward of result.seconds; result.sent is what was sent of this offer."""

    @property
    def own_seconds(self) -> float:
        """Seconds this proposer spent running its own model (a draft's passes), catch-ups excluded:
        its cost on top of the target's pass (`auto` adds it to the arm's time). 0 for the model-free ones."""
        return 0.0

    def cost_curves(self) -> list[PassCosts]:
        """The target pass-cost curves this proposer reads. The loop, not the proposer, teaches them: each
        distinct curve observes every PassResult once (`observe_costs`), so proposers sharing a curve
        (Generator._proposer gives a request's proposers one) do not count a pass twice."""
        return []

    def use_sampler(self, sampler) -> None:
        """How the target chooses tokens (runtime.sampling.Sampler; None: greedy). Called before start();
        a proposer that runs a model (a draft) samples its guesses the same way."""

    def handover(self) -> dict:
        """What the next turn of this conversation may start from (the prefix cache keeps it with the slot):
        an n-gram pool, a draft's cache. Called before close(); what it hands over, close() keeps open."""
        return {}

    def adopt(self, state: dict) -> None:
        """Start from what a finished row with a shared prefix handed over (before start())."""
        close_state(state)

    def close(self) -> None:
        """Release what the proposer holds (a draft model's KV cache)."""

    def __enter__(self) -> Proposer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoProposer(Proposer):
    """Greedy decoding: no guesses, the window is the last token alone."""

    def start(self, prompt: list[int], first: int) -> None:
        pass

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        return Offer()

    def observe(self, result: PassResult) -> None:
        pass


class JacobiProposer(Proposer):
    """Plain Jacobi iteration: the next guesses are the previous pass's predictions past the accepted point.

    Prediction k of a chain pass is the target's guess for the token k+1 places after the window's
    start; the first n were committed, so predictions[n:] guess the positions that follow the new
    last token. Where they run out (always at the start, and by n-1 entries after each pass),
    the window is padded with the last known token: a free guess that is right on repeats.
    Its window is chosen by its policy (windows.AdaptiveWindow: a one-token pass leaves no
    trajectory to score), so its offer is fixed: the whole window, with the trajectory's measured
    acceptance (what the batcher weighs against a wider pass).
    """

    def __init__(self, tracker: AcceptanceTracker | None = None) -> None:
        super().__init__()
        self.tracker = tracker or AcceptanceTracker()
        self.trajectory: list[int] = []
        self.offered: list[int] = []  # this pass's guesses: the trajectory, padded
        self.last = 0
        self.after: list[int] = []  # this pass's forced run

    def cost_curves(self) -> list[PassCosts]:
        return [self.tracker.costs]

    def start(self, prompt: list[int], first: int) -> None:
        self.trajectory, self.offered, self.last, self.after = [], [], first, []

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        self.after = list(after)
        if limit < 1:
            return Offer()
        guesses = _past(self.trajectory, self.after)[:limit]
        fill = guesses[-1] if guesses else (self.after or [self.last])[-1]
        self.offered = guesses + [fill] * (limit - len(guesses))
        return Offer((Guess((self.tracker.rate("jacobi", 0).p,) * limit, tuple(self.offered)),), fixed=True)

    def observe(self, result: PassResult) -> None:
        committed = _past(result.committed, self.after)
        for _, n in result.sent.picks if committed and result.sent else ():
            self.tracker.score(Candidate(self.offered[:n], "jacobi", 0), committed)
        self.last = result.committed[-1]
        self.trajectory = list(result.predictions[len(result.committed) :])  # a chain: nodes in window order


class LookaheadProposer(Proposer):
    """Prompt lookup + the lookahead n-gram pool + the last Jacobi trajectory, sending only what pays.

    Every source offers candidates; the acceptance tracker keeps, per source and match length,
    the chance that a guess is right, and the allocator cuts each candidate to the length with the
    best expected tokens per unit of pass cost (none when a plain greedy pass is better). Up to
    `branches` candidates go into one pass as a tree. Every candidate, sent or not, is scored
    against what the pass committed, so the rates follow the text.
    """

    def __init__(self, branches: int = DEFAULTS.lookahead.branches, tracker: AcceptanceTracker | None = None) -> None:
        super().__init__()
        self.branches = branches
        self.lookup = PromptLookup()
        self.pool = NgramPool()
        self.tracker = tracker or AcceptanceTracker()
        self.trajectory: list[int] = []
        self.pending: list[Candidate] = []  # this pass's candidates (its offer's guesses), scored in observe
        self.warm: NgramPool | None = None  # a pool handed over by the conversation's previous turn
        self.after: list[int] = []  # this pass's forced run: the candidates continue it
        self.stats = {"proposed": 0, "accepted": 0, "accepted_by_source": {}}

    def cost_curves(self) -> list[PassCosts]:
        return [self.tracker.costs]

    def handover(self) -> dict:
        return {"pool": self.pool}

    def adopt(self, state: dict) -> None:
        self.warm = state.get("pool")

    def start(self, prompt: list[int], first: int) -> None:
        self.lookup.reset()
        if self.warm is not None:  # the previous turn's n-grams, the trajectories' included
            self.pool, self.warm = self.warm, None
            self.pool.restart()
            self.stats["warm_pool"] = True
        else:
            self.pool.reset()
        self.lookup.extend([*prompt, first])
        self.pool.extend([*prompt, first])
        self.trajectory, self.pending, self.after = [], [], []

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        """Every source's candidates for the `limit` tokens after the committed ones followed by `after`."""
        self.after, self.pending, n = list(after), [], self.lookup.n_max
        if limit > 0:
            tail = [*self.lookup.tokens[-n:], *after][-n:]
            self.pending = self.lookup.lookup(tail, limit, self.branches)
            self.pending += self.pool.lookup(tail[-2:], limit, self.branches)
            if trajectory := _past(self.trajectory, after):
                self.pending.append(Candidate(trajectory[:limit], "jacobi", 0))
        rate = self.tracker.rate
        guesses = tuple(Guess((rate(c.source, c.match_len).p,) * len(c.tokens), tuple(c.tokens)) for c in self.pending)
        return Offer(guesses, self.branches, self.tracker.config.margin)

    def observe(self, result: PassResult) -> None:
        tree, predictions, verdict = result.tree, result.predictions, result.verdict
        committed = verdict.committed
        own = _past(committed, self.after)  # what the pass committed past the forced run ([] if it left the run)
        accepted = max(0, len(verdict.path) - len(self.after)) if own else 0  # of `own`, the guessed ones
        picks = result.sent.picks if result.sent else []
        self.stats["proposed"] += sum(n for _, n in picks)
        self.stats["accepted"] += accepted
        by_source = self.stats["accepted_by_source"]
        for i, n in picks:
            source, tokens = self.pending[i].source, self.pending[i].tokens[:n]
            if accepted and tokens[:accepted] == own[:accepted]:
                by_source[source] = by_source.get(source, 0) + accepted
                break
        for candidate in self.pending if own else ():
            self.tracker.score(candidate, own)
        context = self.lookup.tokens[-2:]
        for branch in leaf_paths(tree.parents):
            self.pool.observe(context, [tree.tokens[i] for i in branch[1:]], [int(predictions[i]) for i in branch])
        self.lookup.extend(committed)
        self.pool.extend(committed)
        # the trajectory past the accepted node: the predictions of its descendants along the first-listed branch
        node, self.trajectory = (verdict.path[-1] if verdict.path else 0), []
        first_child = {p: i for i, p in reversed(list(enumerate(tree.parents)))}
        while (node := first_child.get(node)) is not None:
            self.trajectory.append(int(predictions[node]))
        self.pending = []


def _past(tokens: Sequence[int], run: Sequence[int]) -> list[int]:
    """`tokens` past `run` when they start with it (a forced run the pass committed), else []."""
    run = list(run)
    return list(tokens[len(run) :]) if list(tokens[: len(run)]) == run else []


class Composite(Proposer):
    """A proposer made of named parts (a union's, auto's arms): each part samples like the target, hands
    over and adopts its own state, and is closed with the whole; the cost curves are all the parts'."""

    def __init__(self, parts: dict[str, Proposer]) -> None:
        super().__init__()
        self.parts = parts

    def cost_curves(self) -> list[PassCosts]:
        return [curve for part in self.parts.values() for curve in part.cost_curves()]

    def use_sampler(self, sampler) -> None:
        for part in self.parts.values():
            part.use_sampler(sampler)

    def handover(self) -> dict:
        return {name: part.handover() for name, part in self.parts.items()}

    def adopt(self, state: dict) -> None:
        """Each part adopts its own state; what no part takes is released."""
        for name, part in self.parts.items():
            part.adopt(state.pop(name, {}))
        close_state(state)

    def close(self) -> None:
        for part in self.parts.values():
            part.close()


class UnionProposer(Composite):
    """Several proposers' guesses verified in one pass (e.g. a draft's chain plus a prompt-lookup copy).

    Its offer is the parts' offers side by side: each guess keeps its own acceptance, production
    cost and margin, each part sends at most its own branches, and all of them share the pass's one
    limit (runtime.allocator), which sends them part by part. Every part observes every pass, with the share of
    the allocation that is its own.
    """

    def __init__(self, parts: dict[str, Proposer]) -> None:
        super().__init__(parts)
        self.spans: list[range] = []  # each part's guesses in the last offer
        self.stats = {name: part.stats for name, part in parts.items()}

    @property
    def own_seconds(self) -> float:
        return sum(part.own_seconds for part in self.parts.values())

    def start(self, prompt: list[int], first: int) -> None:
        for part in self.parts.values():
            part.start(prompt, first)
        self.spans = []
        self.stats = {name: part.stats for name, part in self.parts.items()}  # parts may replace theirs

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        guesses: list[Guess] = []
        branches: list[int] = []
        self.spans = []
        for index, part in enumerate(self.parts.values()):
            offer = part.offer(limit, after)
            start = len(guesses)
            guesses += [
                replace(
                    g, margin=offer.margin if g.margin is None else g.margin, fixed=g.fixed or offer.fixed, part=index
                )
                for g in offer.guesses
            ]
            self.spans.append(range(start, len(guesses)))
            branches.append(len(offer.guesses) if offer.fixed else offer.branches)
        return Offer(tuple(guesses), sum(branches), parts=tuple(branches))

    def observe(self, result: PassResult) -> None:
        for span, part in zip(self.spans, self.parts.values()):
            own = None if result.sent is None else _share(result.sent, span)
            part.observe(replace(result, sent=own))


def _share(sent: Allocation, span: range) -> Allocation:
    """A union part's share of what the pass sent: its picks (in its own offer's indices), within the room the
    other parts left."""
    others = sum(n for i, n in sent.picks if i not in span)
    return Allocation([(i - span.start, n) for i, n in sent.picks if i in span], limit=max(0, sent.limit - others))


_DEFAULT_COSTS = PassCosts(CostConfig(learn=False))  # the prior, for a proposer that reads no curve of its own


def own_cost(proposer: Proposer) -> PassCosts:
    """The one-row cost curve `proposer`'s guesses are weighed against (the request's one curve)."""
    curves = proposer.cost_curves()
    return curves[0] if curves else _DEFAULT_COSTS


def close_state(state) -> None:
    """Release what a handed-over state holds (a draft's cache), parts included."""
    for value in (state or {}).values():
        if isinstance(value, dict):
            close_state(value)
        elif hasattr(value, "close"):
            value.close()


def observe_costs(proposer: Proposer, result: PassResult) -> None:
    """Teach each distinct cost curve `proposer` reads the pass's measured seconds, once."""
    for curve in {id(curve): curve for curve in proposer.cost_curves()}.values():
        curve.observe(result.width, result.seconds, result.rows)
