"""The allocator: the one place that decides how many guessed tokens a pass sends, for every row of
the batcher (a lone generation is a batch of one row).

A proposer only ranks: `offer(limit)` returns its candidate guesses (`Guess`: per-token
acceptance estimates, the tokens when they exist already, and what producing a token costs); the
row sends each chosen guess cut to the length chosen here (`sent_guesses`; a draft's chain is
produced at that length by the batcher's draft step), and the pass's result carries the allocation
back to the proposer. A union's offer is its
parts' guesses side by side (each with its own margin, `Offer.parts` capping each part's branches)
sharing one limit; `auto` compares its arms by `Allocation.value`. Each guess is cut by the one
length rule (`cut`: the L maximising expected committed tokens per unit of pass cost), a guess
that does not beat a greedy pass by the offer's margin is dropped, and the best `branches` go into
the pass. The batcher's budget (runtime.pass_budget) reads `expected_tokens` of the same decision
at each candidate width to pick the pass's width; a lone row's width is its own want.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

Cost = Callable[[int], float]  # a one-row pass of W tokens, in W=1 passes (acceptance.PassCosts)


@dataclass(frozen=True)
class Guess:
    """One candidate continuation: accept[i] is the chance its token i is right when the ones before it were."""

    accept: tuple[float, ...]
    tokens: tuple[int, ...] | None = None  # None: produced only once its length is known (a draft's chain)
    cost: float = 0.0  # producing one token, in target W=1 passes (a draft pass; 0 for n-grams)
    margin: float | None = None  # sent only when it beats a greedy pass by this much; None: the offer's margin
    fixed: bool = False  # sent whole within the limit (a fixed-K draft inside a union); Offer.fixed: all are
    part: int = 0  # in a union's offer: the part it comes from (Offer.parts caps each part's branches)
    free: int = 0  # leading tokens right by construction and free to produce (a grammar's forced run): see _ranked
    producer: Any = None  # for tokens None: who makes them once sized (a DraftProposer: runtime.draft.produce)


@dataclass(frozen=True)
class Offer:
    """A proposer's ranked guesses for one pass."""

    guesses: tuple[Guess, ...] = ()
    branches: int = 1  # most guesses one pass takes
    margin: float = 0.0  # a guess is sent only when it beats a greedy pass by this much
    fixed: bool = False  # send every guess whole (a window the proposer's own policy chose: plain Jacobi)
    parts: tuple[int, ...] = ()  # a union's offer: each part's most branches; the guesses sent then share one limit

    def cut_to(self, most: int) -> Offer:
        """This offer with every guess at most `most` tokens (an arm on trial)."""
        return replace(
            self,
            guesses=tuple(
                replace(g, accept=g.accept[:most], tokens=None if g.tokens is None else g.tokens[:most])
                for g in self.guesses
            ),
        )


@dataclass(frozen=True)
class Allocation:
    picks: list[tuple[int, int]]  # (guess index in the offer, tokens sent), in the order they go into the tree
    expected: float = 1.0  # expected committed tokens of the pass (1: a greedy pass)
    production: float = 0.0  # producing the guesses sent, in target W=1 passes
    limit: int = 0  # the guessed tokens the pass had room for (0: none, so nothing could be sent)

    @property
    def sent(self) -> int:
        """Guessed tokens sent (the pass's window is at most this plus the last token)."""
        return sum(n for _, n in self.picks)

    def units(self, cost: Cost) -> float:
        """What the pass costs in target W=1 passes, producing its guesses included."""
        return cost(self.sent + 1) + self.production

    def value(self, cost: Cost) -> float:
        """Expected committed tokens per target W=1 pass of cost (a greedy pass: 1 / cost(1))."""
        return self.expected / self.units(cost)


def cut(accept: Sequence[float], limit: int, cost: Cost, per_token: float = 0.0) -> tuple[int, float]:
    """The one length rule: the L in 1..limit maximising (1 + a0 + a0 a1 + ...) / (cost(L + 1) + L * per_token),
    and that gain (a greedy pass: 1.0); (0, 1.0) when limit < 1."""
    best, best_gain = 0, 0.0
    expected, term = 1.0, 1.0
    for length in range(1, min(limit, len(accept)) + 1):
        term *= accept[length - 1]
        expected += term
        gain = expected / (cost(length + 1) + length * per_token)
        if gain > best_gain:
            best, best_gain = length, gain
    return (best, best_gain) if best else (0, 1.0)


def expected_tokens(guess: Guess, length: int) -> float:
    """Committed tokens a pass sending `length` tokens of `guess` is expected to give."""
    expected, term = 1.0, 1.0
    for a in guess.accept[:length]:
        term *= a
        expected += term
    return expected


def allocate(offer: Offer, limit: int, cost: Cost) -> Allocation:
    """The guesses one row sends within `limit` guessed tokens (its window minus the last token)."""
    if limit < 1 or not offer.guesses:
        return Allocation([], limit=max(0, limit))
    if offer.fixed:
        return _allocation(offer, [(i, min(limit, len(g.accept))) for i, g in enumerate(offer.guesses)], limit)
    ranked = []
    for i, guess in enumerate(offer.guesses):
        length, gain = _ranked(guess, limit, cost, offer.margin)
        if length:
            ranked.append((gain, i, length))
    ranked.sort(key=lambda item: -item[0])  # stable: equal gains keep the offer's order
    if not offer.parts:
        return _allocation(offer, [(i, length) for _, i, length in ranked[: offer.branches]], limit)
    picks = _shared(offer, ranked, limit, cost)
    return _allocation(offer, sorted(picks, key=lambda pick: offer.guesses[pick[0]].part), limit)  # part by part


def _ranked(guess: Guess, limit: int, cost: Cost, margin: float) -> tuple[int, float]:
    """(length, gain) of `guess` within `limit` by the length rule; length 0 when it does not beat greedy by its margin.
    A fixed guess is sent whole and ahead of the others. A guess with a free run (a grammar's forced tokens) sends
    the run whole, and its tokens past the run by the length rule on what they add to the pass, as if the run were
    committed (judged against the run's own gain, F + 1 tokens for about one pass, they would never be sent)."""
    if guess.fixed:
        return min(limit, len(guess.accept)), float("inf")
    margin = margin if guess.margin is None else guess.margin
    if guess.free:  # a sure run, then the rest judged as if the run were committed: a pass of its own after it
        run = min(guess.free, limit)

        def past(width: int) -> float:  # what widening the run's pass costs
            return cost(run + width) - cost(run + 1) + cost(1)

        length, gain = cut(guess.accept[run:], limit - run, past, guess.cost)
        length = length if gain > 1.0 + margin else 0
        return run + length, expected_tokens(guess, run + length) / (cost(run + length + 1) + length * guess.cost)
    length, gain = cut(guess.accept, limit, cost, guess.cost)
    return (length, gain) if gain > 1.0 + margin else (0, 1.0)


def _shared(offer: Offer, ranked: list[tuple[float, int, int]], limit: int, cost: Cost) -> list[tuple[int, int]]:
    """A union's picks: best first, each part within its own branches, all within one limit (a later
    guess is cut again to the room left, and dropped if it no longer pays)."""
    picks, taken, room = [], [0] * len(offer.parts), limit
    for _, i, length in ranked:
        guess = offer.guesses[i]
        if room < 1 or taken[guess.part] >= offer.parts[guess.part]:
            continue
        if length > room:
            length = _ranked(guess, room, cost, offer.margin)[0]
        if length:
            picks.append((i, length))
            taken[guess.part] += 1
            room -= length
    return picks


def _allocation(offer: Offer, picks: list[tuple[int, int]], limit: int) -> Allocation:
    picks = [(i, n) for i, n in picks if n > 0]
    sent = [(offer.guesses[i], n) for i, n in picks]
    expected = max((expected_tokens(g, n) for g, n in sent), default=1.0)  # extra branches: counted as nothing
    return Allocation(picks, expected, sum(g.cost * max(0, n - g.free) for g, n in sent), limit)


def produced(offer: Offer, allocation: Allocation) -> list[tuple[Any, int]]:
    """The (producer, tokens) of each sent guess that does not exist yet (a draft's chain): what the
    batcher's draft step makes before the pass."""
    return [(g.producer, n) for i, n in allocation.picks if (g := offer.guesses[i]).tokens is None]


def sent_guesses(offer: Offer, allocation: Allocation) -> list[list[int]]:
    """The guesses the allocation sends, in tree order: each known guess cut to its length, a produced
    chain as its producer made it (`producer.chain`, after the draft step)."""
    return [
        list(g.tokens[:n]) if g.tokens is not None else list(g.producer.chain)
        for i, n in allocation.picks
        for g in (offer.guesses[i],)
    ]
