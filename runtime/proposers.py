"""Proposers fill a window's guesses. They see token ids only.

The loop asks `propose(k)` for k guesses to follow the last committed token, runs the target
over [last, *guesses], and calls `update(guesses, predictions, n)` with what it accepted, so a
proposer can keep state (the Jacobi trajectory, an n-gram pool, a draft model's cache).
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Proposer(ABC):
    @abstractmethod
    def start(self, prompt: list[int], first: int) -> None:
        """A new sequence: the prompt, and the first token the prefill produced."""

    @abstractmethod
    def propose(self, k: int) -> list[int]:
        """k guesses for the tokens after the last committed one (fewer is allowed, none too)."""

    @abstractmethod
    def update(self, guesses: list[int], predictions: list[int], n: int) -> None:
        """The target saw [last, *guesses], predicted `predictions`, and committed predictions[:n]."""


class JacobiProposer(Proposer):
    """Plain Jacobi iteration: the next guesses are the previous pass's predictions past the accepted point.

    Prediction k of a pass is the target's guess for the token k+1 places after the window's
    start; the first n were committed, so predictions[n:] guess the positions that follow the new
    last token. Where they run out (always at the start, and by n-1 entries after each pass),
    the window is padded with the last known token: a free guess that is right on repeats.
    """

    def __init__(self) -> None:
        self.trajectory: list[int] = []
        self.last = 0

    def start(self, prompt: list[int], first: int) -> None:
        self.trajectory, self.last = [], first

    def propose(self, k: int) -> list[int]:
        guesses = self.trajectory[:k]
        fill = guesses[-1] if guesses else self.last
        return guesses + [fill] * (k - len(guesses))

    def update(self, guesses: list[int], predictions: list[int], n: int) -> None:
        self.last = predictions[n - 1]
        self.trajectory = list(predictions[n:])


class NoProposer(Proposer):
    """Greedy decoding: no guesses, the window is the last token alone."""

    def start(self, prompt: list[int], first: int) -> None:
        pass

    def propose(self, k: int) -> list[int]:
        return []

    def update(self, guesses: list[int], predictions: list[int], n: int) -> None:
        pass
