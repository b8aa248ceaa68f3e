"""Proposers fill a window's guesses. They see token ids only.

The loop asks `offer(limit)` for ranked candidate continuations of the committed sequence with
their per-token acceptance estimates (runtime.allocator.Offer), lets the allocator choose how much
of each to send, gets them from `take(allocation, limit)` (one chain, several branches, or none),
verifies them all in one target pass as a tree (runtime.tree), and calls `update(result)` with the pass's PassResult (runtime.passes: the tree, what the target
predicted and committed, and the forward's measured seconds), so a proposer can keep state (the
Jacobi trajectory, an n-gram pool, a draft model's cache) and learn the pass's cost without timing it.

Under a grammar (structured output) the window starts with the tokens the grammar forces; the loop
asks `offer(limit, after=forced)`, and the proposer guesses past them as if they were committed
(its guesses, taken and scored, are the tokens after the run).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Sequence

from .acceptance import AcceptanceTracker, PassCosts
from .allocator import Allocation, Guess, Offer, allocate
from .config import DEFAULTS, AutoConfig, CostConfig
from .ngram import Candidate, NgramPool, PromptLookup
from .passes import PassResult
from .tree import leaf_paths


class Proposer(ABC):
    stats: dict  # counters merged into the generation's statistics
    # Seconds take() spent feeding tokens the proposer had not seen yet (a draft's prefill, or its
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
        forced run): the guesses continue them, and `take` and `update` read this pass that way."""

    @abstractmethod
    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        """The guesses the allocator chose from this pass's offer (`allocation`), in tree order (`limit`:
        the guessed tokens the pass has room for)."""

    @abstractmethod
    def update(self, result: PassResult) -> None:
        """The target saw result.tree, predicted result.predictions (one per node), and committed
        result.committed in a forward of result.seconds."""

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

    def __enter__(self) -> "Proposer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoProposer(Proposer):
    """Greedy decoding: no guesses, the window is the last token alone."""

    def start(self, prompt: list[int], first: int) -> None:
        pass

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        return Offer()

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        return []

    def update(self, result: PassResult) -> None:
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
        self.sent: list[list[int]] = []
        self.last = 0
        self.after: list[int] = []  # this pass's forced run

    def cost_curves(self) -> list[PassCosts]:
        return [self.tracker.costs]

    def start(self, prompt: list[int], first: int) -> None:
        self.trajectory, self.offered, self.sent, self.last, self.after = [], [], [], first, []

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        self.after = list(after)
        if limit < 1:
            return Offer()
        guesses = _past(self.trajectory, self.after)[:limit]
        fill = guesses[-1] if guesses else (self.after or [self.last])[-1]
        self.offered = guesses + [fill] * (limit - len(guesses))
        return Offer((Guess((self.tracker.rate("jacobi", 0).p,) * limit, tuple(self.offered)),), fixed=True)

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        self.sent = [self.offered[:n] for _, n in allocation.picks]
        return self.sent

    def update(self, result: PassResult) -> None:
        committed = _past(result.committed, self.after)
        for sent in self.sent if committed else ():
            self.tracker.score(Candidate(sent, "jacobi", 0), committed)
        self.sent = []
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
        self.pending: list[Candidate] = []  # this pass's candidates, scored in update
        self.sent: list[tuple[str, list[int]]] = []  # (source, tokens) of the branches in this pass
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

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        self.sent = [(self.pending[i].source, self.pending[i].tokens[:n]) for i, n in allocation.picks]
        self.stats["proposed"] += allocation.sent
        return [tokens for _, tokens in self.sent]

    def update(self, result: PassResult) -> None:
        tree, predictions, verdict = result.tree, result.predictions, result.verdict
        committed = verdict.committed
        own = _past(committed, self.after)  # what the pass committed past the forced run ([] if it left the run)
        accepted = max(0, len(verdict.path) - len(self.after)) if own else 0  # of `own`, the guessed ones
        self.stats["accepted"] += accepted
        by_source = self.stats["accepted_by_source"]
        for source, tokens in self.sent:
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
        self.pending, self.sent = [], []


def _past(tokens: Sequence[int], run: Sequence[int]) -> list[int]:
    """`tokens` past `run` when they start with it (a forced run the pass committed), else []."""
    run = list(run)
    return list(tokens[len(run):]) if list(tokens[: len(run)]) == run else []


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
    limit (runtime.allocator). `take` hands each part the share of the allocation that is its own
    (and the room the other parts left), and sends what they all send. Every part sees every pass's result.
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
            guesses += [replace(g, margin=offer.margin if g.margin is None else g.margin, fixed=g.fixed or offer.fixed,
                                part=index) for g in offer.guesses]
            self.spans.append(range(start, len(guesses)))
            branches.append(len(offer.guesses) if offer.fixed else offer.branches)
        return Offer(tuple(guesses), sum(branches), parts=tuple(branches))

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        sent: list[list[int]] = []
        for span, part in zip(self.spans, self.parts.values()):
            own = [(i - span.start, n) for i, n in allocation.picks if i in span]
            others = sum(n for i, n in allocation.picks if i not in span)
            sent += part.take(Allocation(own), max(0, limit - others))
        return sent

    def update(self, result: PassResult) -> None:
        for part in self.parts.values():
            part.update(result)


class ArmHistory:
    """What `auto`'s arms did in earlier calls of one Generator, so a losing arm is not re-tried
    on every call. Trying a draft costs its prefill over the whole prompt, which on short
    answers is as much as lookahead gains; so an arm that lost sits out the next 1, 2, 4, ...
    `max_sit_out` calls, and one win resets it. The first arm is never benched. Thread-safe:
    concurrent calls share it.
    """

    def __init__(self, max_sit_out: int = DEFAULTS.auto.max_sit_out) -> None:
        self.max_sit_out = max_sit_out
        self.losses: dict[str, int] = {}  # per arm: consecutive calls in which it was tried and was not the best
        self.sit_out: dict[str, int] = {}  # and the calls it still skips
        self._lock = threading.Lock()

    def admit(self, names: list[str]) -> list[str]:
        """The arms this call may use; each benched arm's wait shrinks by one call."""
        with self._lock:
            admitted = names[:1]
            for name in names[1:]:
                if self.sit_out.get(name, 0) > 0:
                    self.sit_out[name] -= 1
                else:
                    admitted.append(name)
            return admitted

    def record(self, tried: list[str], best: str) -> None:
        """After a call: the arms that got a fair trial, and the one that won (`AutoProposer.close`)."""
        with self._lock:
            for name in tried:
                self.losses[name] = 0 if name == best else self.losses.get(name, 0) + 1
                self.sit_out[name] = min(2 ** (self.losses[name] - 1), self.max_sit_out) if self.losses[name] else 0


@dataclass
class _Pass:
    """The arm `auto` gave a pass to, and what that arm's allocation predicted for it."""

    arm: str
    expected: float = 1.0  # committed tokens
    units: float = 1.0  # target W=1 passes of cost, the guesses' production included
    own_before: float = 0.0  # the arm's own_seconds before its guesses were made
    best: bool = False  # the arm got the pass as the best (not warming up, not probed)


class AutoProposer(Composite):
    """Several proposers as arms: each pass goes to the arm whose offer is worth most.

    Every arm offers each pass; the allocator cuts each offer and prices it (`Allocation.value`:
    expected committed tokens per target W=1 pass of cost, a draft's production included). The
    measured record checks those prices: per arm, the committed tokens per second of measured
    time (the target's forward, PassResult.seconds, plus the arm's own model time, `own_seconds`,
    not its one-time catch-up such as a draft's prefill) over the tokens per unit its offers
    predicted on the same passes gives the units per second the arm really delivers; an arm's score
    is its offer's value times that, so an arm whose estimates run optimistic (a draft slower than
    its timing says, acceptance below its prior) loses passes to the others. Each arm first gets
    `warmup` passes; an arm on trial (warming up or probed) offers at most `probe_budget` guesses,
    so trying a slow draft stays cheap; an arm that has not been the best for `probe_every` passes is
    probed (when its offer sends anything), and the wait doubles each time it is probed and still
    not the best. Totals decay slowly, so one lucky pass cannot decide. The arms not chosen still
    see every pass, so their state follows the sequence and they can take over at once. With a `history`
    (one per Generator), an arm that lost earlier calls sits some calls out: the arm whose passes as the
    best committed the most tokens won the call.
    """

    def __init__(self, arms: dict[str, Proposer], config: AutoConfig = DEFAULTS.auto,
                 history: ArmHistory | None = None) -> None:
        super().__init__(arms)  # parts: every arm; arms: those admitted to this call (ArmHistory)
        self.history = history
        self.arms = arms
        self.config = config  # warm-up, probes and their budget, decay (runtime.config.AutoConfig)
        self.tokens: dict[str, float] = {}  # measured, decayed: committed tokens
        self.seconds: dict[str, float] = {}  # and the seconds they took
        self.predicted: dict[str, float] = {}  # predicted, decayed: committed tokens
        self.units: dict[str, float] = {}  # and the W=1 pass units they would cost
        self.tried: dict[str, int] = {}
        self.won: dict[str, int] = {}  # tokens committed by the passes each arm got as the best
        self.due: dict[str, int] = {}  # pass count at which an arm that is not the best is probed next
        self.wait: dict[str, int] = {}
        self.passes = 0
        self.current = next(iter(arms))
        self.on_trial = False
        self.pending: _Pass | None = None  # the pass being verified
        self.stats = {"passes_by_arm": {name: 0 for name in arms}}

    def start(self, prompt: list[int], first: int) -> None:
        names = list(self.parts)
        admitted = self.history.admit(names) if self.history else names
        self.arms = {name: self.parts[name] for name in admitted}
        self.current = next(iter(self.arms))
        self.stats["sat_out"] = [name for name in names if name not in admitted]
        for arm in self.arms.values():
            arm.start(prompt, first)
        for totals in (self.tokens, self.seconds, self.predicted, self.units):
            totals.clear()
            totals.update({name: 0.0 for name in self.arms})
        self.tried = {name: 0 for name in self.arms}
        self.won = {name: 0 for name in self.arms}
        self.wait = {name: self.config.probe_every for name in self.arms}
        self.due = {name: self.config.probe_every for name in self.arms}  # just measured in its warmup
        self.passes, self.pending = 0, None
        self.stats["arms"] = {name: arm.stats for name, arm in self.parts.items()}

    def rate(self, name: str) -> float:
        """Measured committed tokens per second of the passes `name` got."""
        return self.tokens[name] / self.seconds[name] if self.seconds[name] else 0.0

    def calibration(self, name: str) -> float:
        """Measured tokens per second over the tokens per unit its offers predicted: the W=1 pass units per
        second the arm really delivers (the best known one for an arm not measured yet)."""
        known = {arm: self.rate(arm) * self.units[arm] / self.predicted[arm] for arm in self.arms if self.seconds[arm]}
        return known.get(name, max(known.values(), default=1.0))

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        if limit < 1:
            for arm in self.arms.values():  # each arm still reads the pass as following `after`
                arm.offer(0, after)
            self.pending = None
            return Offer()
        self.passes += 1
        offers = {name: arm.offer(limit, after) for name, arm in self.arms.items()}
        self.current, self.on_trial = self.choose(offers, limit)
        warm = all(tried >= self.config.warmup for tried in self.tried.values())
        self.pending = _Pass(self.current, best=warm and not self.on_trial)
        self.stats["passes_by_arm"][self.current] += 1
        offer = offers[self.current]
        return offer.cut_to(self.config.probe_budget) if self.on_trial else offer

    def choose(self, offers: dict[str, Offer], limit: int) -> tuple[str, bool]:
        """The arm for this pass, and whether it is on trial (warming up or probed)."""
        for index, (name, tried) in enumerate(self.tried.items()):
            if tried < self.config.warmup:
                return name, index > 0  # the first arm runs as it would alone
        scores = {name: self._allocation(name, offer, limit).value(own_cost(self.arms[name])) * self.calibration(name)
                  for name, offer in offers.items()}
        best = max(self.arms, key=scores.__getitem__)  # ties: the earlier arm
        self.due[best], self.wait[best] = self.passes + self.config.probe_every, self.config.probe_every
        for name, offer in offers.items():
            if name != best and self.passes >= self.due[name]:
                if not self._allocation(name, offer.cut_to(self.config.probe_budget), limit).sent:
                    continue  # nothing to try: probing it now would be a greedy pass
                self.due[name] = self.passes + self.wait[name]
                self.wait[name] *= 2  # back to probe_every once it is the best again
                return name, True
        return best, False

    def _allocation(self, name: str, offer: Offer, limit: int) -> Allocation:
        return allocate(offer, limit, own_cost(self.arms[name]))

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        if self.pending is None:
            return []
        arm = self.arms[self.current]
        self.pending.expected = allocation.expected
        self.pending.units = allocation.units(own_cost(arm))
        self.pending.own_before = arm.own_seconds
        return arm.take(allocation, min(limit, self.config.probe_budget) if self.on_trial else limit)

    def update(self, result: PassResult) -> None:
        for arm in self.arms.values():
            arm.update(result)
        done, self.pending = self.pending, None
        if done is None:
            return
        name, d = done.arm, self.config.decay
        self.tried[name] += 1
        self.won[name] += len(result.committed) if done.best else 0
        own = self.arms[name].own_seconds - done.own_before
        self.tokens[name] = self.tokens[name] * d + len(result.committed)
        self.seconds[name] = self.seconds[name] * d + result.seconds + own
        self.predicted[name] = self.predicted[name] * d + done.expected
        self.units[name] = self.units[name] * d + done.units

    def close(self) -> None:
        if self.history and self.passes >= self.config.probe_every:  # a few passes of a short answer prove nothing
            tried = [name for name, count in self.tried.items() if count >= self.config.warmup]
            if len(tried) > 1:
                self.history.record(tried, max(tried, key=self.won.__getitem__))
        super().close()


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
