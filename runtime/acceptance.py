"""How many guesses are worth a pass: per-source acceptance rates against the cost of a wider window."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .config import CPU_PASS_COSTS, DEFAULTS, DecodingConfig
from .ngram import Candidate


def pass_cost(window: int, costs: dict[int, float] = CPU_PASS_COSTS) -> float:
    """Relative cost of a pass of `window` tokens: piecewise-linear in the table, extrapolated past its ends."""
    points = sorted(costs.items())
    if len(points) == 1:
        return points[0][1]
    for (w0, c0), (w1, c1) in zip(points, points[1:]):
        if window <= w1 or (w1, c1) == points[-1]:
            return c0 + (c1 - c0) * (window - w0) / (w1 - w0)
    raise AssertionError("unreachable")


@dataclass
class PassCosts:
    """The cost of a target pass of W tokens relative to one of 1 token, learned on this machine.

    Starts from a table (`CPU_PASS_COSTS`); once a window and W=1 have both been timed a few
    times, their measured ratio replaces the table, so the same code sends longer guesses on a
    GPU, where wide passes are nearly free. `learn=False` keeps the table (deterministic tests).
    """

    table: dict[int, float] = field(default_factory=DEFAULTS.pass_cost_table)
    learn: bool = DEFAULTS.learn_costs
    smoothing: float = DEFAULTS.cost_smoothing
    min_samples: int = DEFAULTS.cost_min_samples
    seconds: dict[int, float] = field(default_factory=dict)  # moving average of the pass time by window
    samples: dict[int, int] = field(default_factory=dict)
    _memo: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_config(cls, config: DecodingConfig, table: dict[int, float] | None = None) -> "PassCosts":
        """The config's cost curve: its pass_costs table (or `table`), learned as it says."""
        return cls(table or config.pass_cost_table(), config.learn_costs, config.cost_smoothing, config.cost_min_samples)

    def __call__(self, window: int) -> float:
        if window not in self._memo:
            if self.samples.get(window, 0) >= self.min_samples and self.samples.get(1, 0) >= self.min_samples:
                self._memo[window] = self.seconds[window] / self.seconds[1]
            else:
                self._memo[window] = pass_cost(window, self.table)
        return self._memo[window]

    def observe(self, window: int, seconds: float) -> None:
        if not self.learn:
            return
        old = self.seconds.get(window)
        self.seconds[window] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
        self.samples[window] = self.samples.get(window, 0) + 1
        self._memo.pop(window, None)
        if window == 1:
            self._memo.clear()

    def unit_seconds(self) -> float | None:
        """Seconds of a W=1 pass: measured, else estimated from the widest measured window."""
        if 1 in self.seconds:
            return self.seconds[1]
        if self.seconds:
            window, seconds = max(self.seconds.items())
            return seconds / self(window)
        return None


def best_length(p: float, limit: int, cost: Callable[[int], float], per_token: float = 0.0) -> tuple[int, float]:
    """The one length rule: the number of guesses L in 1..limit maximising the expected committed
    tokens per unit of time, (1 + p + ... + p^L) / (cost(L + 1) + L * per_token), and that gain
    (a greedy pass: 1.0); (0, 1.0) when limit < 1. p: the chance a guess is right when the ones before
    it were; cost: the target pass-cost curve; per_token: what producing one guess costs, in target
    W=1 passes (a draft pass; 0 for free guesses such as n-grams). Lookahead's candidates and the
    draft's chain are both cut by it; each caller decides whether the gain beats greedy by its margin."""
    best, best_gain = 0, 0.0
    expected, term = 1.0, 1.0
    for length in range(1, limit + 1):
        term *= p
        expected += term
        gain = expected / (cost(length + 1) + length * per_token)
        if gain > best_gain:
            best, best_gain = length, gain
    return (best, best_gain) if best else (0, 1.0)


def matched_prefix(tokens: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading tokens of a guess equal the committed tokens."""
    n = 0
    for guess, token in zip(tokens, committed):
        if guess != token:
            break
        n += 1
    return n


@dataclass
class Rate:
    """Decayed counts of guessed tokens tried and right, for one (source, match length)."""

    right: float
    tried: float

    @property
    def p(self) -> float:
        """Chance that a guess is right given the guesses before it were (geometric model)."""
        return self.right / self.tried


@dataclass
class AcceptanceTracker:
    """Per source and match length, the chance p that the next guessed token is right when the
    previous ones were; sending L guesses then yields 1 + p + p^2 + ... + p^L tokens per pass.

    `best_length` picks the L that maximises tokens per unit of pass cost, 0 when no L beats
    a plain greedy pass by `margin`. Every candidate, sent or not, is scored against the tokens
    the pass committed, so a source that is not being sent keeps being measured for free.
    """

    costs: PassCosts = field(default_factory=PassCosts)
    prior: float = DEFAULTS.acceptance_prior  # the constants' reasons: runtime.config.DecodingConfig
    prior_weight: float = DEFAULTS.acceptance_prior_weight
    decay: float = DEFAULTS.acceptance_decay
    max_match: int = DEFAULTS.acceptance_max_match
    margin: float = DEFAULTS.acceptance_margin
    rates: dict[tuple[str, int], Rate] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: DecodingConfig, costs: PassCosts | None = None) -> "AcceptanceTracker":
        """costs: the request's one cost curve (shared with its other proposers); None: a new one."""
        return cls(costs or PassCosts.from_config(config), config.acceptance_prior, config.acceptance_prior_weight,
                   config.acceptance_decay, config.acceptance_max_match, config.acceptance_margin)

    def rate(self, source: str, match_len: int) -> Rate:
        key = (source, min(match_len, self.max_match))
        if key not in self.rates:
            self.rates[key] = Rate(self.prior * self.prior_weight, self.prior_weight)
        return self.rates[key]

    def score(self, candidate: Candidate, committed: Sequence[int]) -> None:
        """Learn from one pass: compare the candidate with the tokens the pass committed.

        Guesses up to and including the first wrong one were tried; those after it, or beyond
        the committed tokens, tell nothing and are not counted.
        """
        right = matched_prefix(candidate.tokens, committed)
        tried = right + (right < min(len(candidate.tokens), len(committed)))
        if tried == 0:
            return
        rate = self.rate(candidate.source, candidate.match_len)
        rate.right = rate.right * self.decay + right
        rate.tried = rate.tried * self.decay + tried

    def cost(self, window: int) -> float:
        """Relative cost of a pass of `window` tokens (see PassCosts)."""
        return self.costs(window)

    def best_length(self, p: float, available: int) -> tuple[int, float]:
        """The number of guesses (0..available) with the best gain, and that gain (greedy: 1.0): the
        one length rule (`best_length`), 0 unless it beats a greedy pass by `margin`."""
        length, gain = best_length(p, available, self.costs)
        return (length, gain) if gain > 1.0 + self.margin else (0, 1.0)
