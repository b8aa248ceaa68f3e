"""Window policies: how many tokens the next pass verifies.

`FixedWindow` always uses the same window. `AdaptiveWindow` keeps two arms, greedy passes
(window 1) and Jacobi passes (window W), measures each arm's committed tokens per second, and
uses the faster one, trying the other for two passes every `probe_every` passes (the pass cost
and the acceptance drift as the context grows). The first pass of a probe back to Jacobi starts
from stale guesses, so only the second one is measured. Where guesses rarely hit (plain Jacobi on a CPU,
where a W-token pass costs clearly more than a 1-token pass) it settles on greedy passes, so a
strategy is never much slower than greedy decoding. The output is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import JacobiConfig
from .passes import PassResult


@dataclass
class FixedWindow:
    window: int

    def next(self) -> int:
        return self.window

    def observe(self, result: PassResult) -> None:
        pass


@dataclass
class Arm:
    seconds: float | None = None  # moving average of the pass time
    tokens: float | None = None  # moving average of tokens committed per pass


@dataclass
class AdaptiveWindow:
    window: int  # the Jacobi arm's window
    config: JacobiConfig = field(default_factory=JacobiConfig)  # how often to probe, how fast to forget
    arms: dict[int, Arm] = field(default_factory=dict)
    passes: int = 0
    _probe: int = 0  # passes left in the current probe of the other arm
    _skip: bool = False  # do not measure the next observed pass

    def __post_init__(self) -> None:
        self.arms = {self.window: Arm(), 1: Arm()}

    def next(self) -> int:
        self.passes += 1
        for w, arm in self.arms.items():
            if arm.seconds is None:
                return w
        if self._probe:
            self._probe -= 1
        elif self.passes % self.config.probe_every == 0:
            self._probe, self._skip = 1, True
        else:
            return max(self.arms, key=self.rate)
        return min(self.arms, key=self.rate)  # a probe of the other arm

    def rate(self, w: int) -> float:
        arm = self.arms[w]
        return (arm.tokens or 0.0) / arm.seconds if arm.seconds else 0.0

    def observe(self, result: PassResult) -> None:
        arm = self.arms.get(result.window)
        skip, self._skip = self._skip, False
        if arm is None or skip:  # a window cut short (max_new_tokens, context) or a probe's warm-up pass
            return
        a, seconds, accepted = self.config.smoothing, result.seconds, len(result.committed)
        arm.seconds = seconds if arm.seconds is None else (1 - a) * arm.seconds + a * seconds
        arm.tokens = accepted if arm.tokens is None else (1 - a) * arm.tokens + a * accepted
