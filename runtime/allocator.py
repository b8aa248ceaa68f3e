"""The allocator: the one place that decides how many guessed tokens a pass sends, for the single
generation loop (decoding.step) and for every row of the batch engine.

A proposer only ranks: `offer(limit)` returns its candidate guesses (`Guess`: per-token
acceptance estimates, the tokens when they exist already, and what producing a token costs) and
`take(lengths)` returns the guesses cut to the lengths chosen here. Each guess is cut by the one
length rule (`cut`: the L maximising expected committed tokens per unit of pass cost), a guess
that does not beat a greedy pass by the offer's margin is dropped, and the best `branches` go into
the pass. The batch engine (runtime.scheduler) reads `expected_tokens` of the same decision at
each candidate width to pick the pass's width, so a lone row gets exactly what a single generation
gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

Cost = Callable[[int], float]  # a one-row pass of W tokens, in W=1 passes (acceptance.PassCosts)


@dataclass(frozen=True)
class Guess:
    """One candidate continuation: accept[i] is the chance its token i is right when the ones before it were."""

    accept: tuple[float, ...]
    tokens: tuple[int, ...] | None = None  # None: produced only once its length is known (a draft's chain)
    cost: float = 0.0  # producing one token, in target W=1 passes (a draft pass; 0 for n-grams)


@dataclass(frozen=True)
class Offer:
    """A proposer's ranked guesses for one pass."""

    guesses: tuple[Guess, ...] = ()
    branches: int = 1  # most guesses one pass takes
    margin: float = 0.0  # a guess is sent only when it beats a greedy pass by this much
    fixed: bool = False  # send every guess whole (a window the proposer's own policy chose: plain Jacobi)


@dataclass(frozen=True)
class Allocation:
    picks: list[tuple[int, int]]  # (guess index in the offer, tokens sent), in the order they go into the tree
    expected: float = 1.0  # expected committed tokens of the pass (1: a greedy pass)
    production: float = 0.0  # producing the guesses sent, in target W=1 passes

    def lengths(self, count: int) -> list[int]:
        """Tokens sent per guess of an offer of `count` guesses (0: not sent)."""
        out = [0] * count
        for i, n in self.picks:
            out[i] = n
        return out


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


def allocate(offer: Offer | None, limit: int, cost: Cost) -> Allocation:
    """The guesses one row sends within `limit` guessed tokens (its window minus the last token)."""
    if offer is None or limit < 1 or not offer.guesses:
        return Allocation([])
    if offer.fixed:
        return _allocation(offer, [(i, min(limit, len(g.accept))) for i, g in enumerate(offer.guesses)])
    ranked = []
    for i, guess in enumerate(offer.guesses):
        length, gain = cut(guess.accept, limit, cost, guess.cost)
        if length and gain > 1.0 + offer.margin:
            ranked.append((gain, i, length))
    ranked.sort(key=lambda item: -item[0])  # stable: equal gains keep the offer's order
    return _allocation(offer, [(i, length) for _, i, length in ranked[: offer.branches]])


def _allocation(offer: Offer, picks: list[tuple[int, int]]) -> Allocation:
    picks = [(i, n) for i, n in picks if n > 0]
    sent = [(offer.guesses[i], n) for i, n in picks]
    expected = max((expected_tokens(g, n) for g, n in sent), default=1.0)  # extra branches: counted as nothing
    return Allocation(picks, expected, sum(g.cost * n for g, n in sent))
