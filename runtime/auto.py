"""`auto`: lookahead and a draft arm in one row, each pass going to the arm whose offer is worth most.

`AutoProposer` compares the arms' offers priced by the one length rule (runtime.allocator), each
times its measured calibration; `ArmHistory` remembers across a Generator's calls which arm lost, so
a draft's costly first probe is not paid on every call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .allocator import Allocation, Offer, allocate
from .config import DEFAULTS, AutoConfig
from .passes import PassResult
from .proposers import Composite, Proposer, own_cost


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
    """The arm `auto` gave a pass to (what its allocation predicted comes back in the pass's result)."""

    arm: str
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

    def __init__(
        self, arms: dict[str, Proposer], config: AutoConfig = DEFAULTS.auto, history: ArmHistory | None = None
    ) -> None:
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
        own_before = self.arms[self.current].own_seconds  # its guesses are produced after this offer
        self.pending = _Pass(self.current, own_before=own_before, best=warm and not self.on_trial)
        self.stats["passes_by_arm"][self.current] += 1
        offer = offers[self.current]
        return offer.cut_to(self.config.probe_budget) if self.on_trial else offer

    def choose(self, offers: dict[str, Offer], limit: int) -> tuple[str, bool]:
        """The arm for this pass, and whether it is on trial (warming up or probed)."""
        for index, (name, tried) in enumerate(self.tried.items()):
            if tried < self.config.warmup:
                return name, index > 0  # the first arm runs as it would alone
        scores = {
            name: self._allocation(name, offer, limit).value(own_cost(self.arms[name])) * self.calibration(name)
            for name, offer in offers.items()
        }
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

    def observe(self, result: PassResult) -> None:
        """Every arm observes the pass (the chosen one with what was sent of its offer); the chosen arm's
        measured and predicted totals grow."""
        done, self.pending = self.pending, None
        sent = result.sent if done is not None else None
        if sent is not None and self.on_trial:  # an arm on trial had at most probe_budget tokens of room
            sent = replace(sent, limit=min(sent.limit, self.config.probe_budget))
        for name, arm in self.arms.items():
            arm.observe(replace(result, sent=sent if done is not None and name == done.arm else None))
        if done is None or result.sent is None:
            return
        name, d = done.arm, self.config.decay
        self.tried[name] += 1
        self.won[name] += len(result.committed) if done.best else 0
        own = self.arms[name].own_seconds - done.own_before
        self.tokens[name] = self.tokens[name] * d + len(result.committed)
        self.seconds[name] = self.seconds[name] * d + result.seconds + own
        self.predicted[name] = self.predicted[name] * d + result.sent.expected
        self.units[name] = self.units[name] * d + result.sent.units(own_cost(self.arms[name]))

    def close(self) -> None:
        if self.history and self.passes >= self.config.probe_every:  # a few passes of a short answer prove nothing
            tried = [name for name, count in self.tried.items() if count >= self.config.warmup]
            if len(tried) > 1:
                self.history.record(tried, max(tried, key=self.won.__getitem__))
        super().close()
