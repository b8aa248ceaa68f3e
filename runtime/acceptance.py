"""How many guesses are worth a pass: per-source acceptance rates against the cost of a wider window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .config import CPU_PASS_COSTS, CostConfig, LookaheadConfig
from .ngram import Candidate


def pass_cost(window: int, costs: dict[int, float] = CPU_PASS_COSTS) -> float:
    """Relative cost of a pass of `window` tokens: piecewise-linear in the table, extrapolated past its ends."""
    points = sorted(costs.items())
    if len(points) == 1:
        return points[0][1]
    segments = list(zip(points, points[1:]))
    (w0, c0), (w1, c1) = next((s for s in segments if window <= s[1][0]), segments[-1])  # the last: extrapolated
    return c0 + (c1 - c0) * (window - w0) / (w1 - w0)


@dataclass
class PassCosts:
    """The cost of a target pass of `rows` rows x `width` tokens relative to one row of one token,
    learned on this machine.

    Keyed by (rows, width), not by total tokens: the CPU reads the weights once per pass and a row's
    attention is its own, so 16 rows x 2 cost about 4.3 W=1 passes but one row of 32 about 2.9.
    Starts from two priors, `table` for one row by width (`CPU_PASS_COSTS`) and `batch_table` for
    several rows by their total tokens (`BATCH_PASS_COSTS`); once a (rows, width) and (1, 1) have
    both been timed a few times, their measured ratio replaces the prior, so the same code sends
    longer guesses on a GPU, where wide passes are nearly free. `learn=False` keeps the priors
    (deterministic tests).
    """

    config: CostConfig = field(default_factory=CostConfig)  # the priors and how to learn (runtime.config)
    seconds: dict[tuple[int, int], float] = field(
        default_factory=dict
    )  # moving average of the pass time by (rows, width)
    samples: dict[tuple[int, int], int] = field(default_factory=dict)
    _memo: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.table, self.batch_table = dict(self.config.pass_costs), dict(self.config.batch_pass_costs)

    def __call__(self, width: int, rows: int = 1) -> float:
        key = (rows, width)
        if key not in self._memo:
            least = self.config.min_samples
            if self.samples.get(key, 0) >= least and self.samples.get((1, 1), 0) >= least:
                self._memo[key] = self.seconds[key] / self.seconds[(1, 1)]
            else:  # the prior
                prior = (width, self.table) if rows == 1 else (rows * width, self.batch_table)
                self._memo[key] = pass_cost(*prior)
        return self._memo[key]

    def observe(self, width: int, seconds: float, rows: int = 1) -> None:
        if not self.config.learn:
            return
        key = (rows, width)
        old = self.seconds.get(key)
        self.seconds[key] = (
            seconds if old is None else (1 - self.config.smoothing) * old + self.config.smoothing * seconds
        )
        self.samples[key] = self.samples.get(key, 0) + 1
        self._memo.pop(key, None)
        if key == (1, 1):
            self._memo.clear()

    def unit_seconds(self) -> float | None:
        """Seconds of a one-row W=1 pass: measured, else estimated from the widest measured pass."""
        if (1, 1) in self.seconds:
            return self.seconds[(1, 1)]
        if self.seconds:
            (rows, width), seconds = max(self.seconds.items(), key=lambda item: item[0][0] * item[0][1])
            return seconds / self(width, rows)
        return None


def matched_prefix(tokens: Sequence[int], committed: Sequence[int]) -> int:
    """How many leading tokens of a guess equal the committed tokens."""
    return next(
        (n for n, (guess, token) in enumerate(zip(tokens, committed)) if guess != token),
        min(len(tokens), len(committed)),
    )


@dataclass
class Rate:
    """Decayed counts of guessed tokens tried and right, for one (source, match length)."""

    right: float
    tried: float

    @property
    def p(self) -> float:
        """Chance that a guess is right given the guesses before it were (geometric model)."""
        return self.right / self.tried

    def observe(self, right: int, tried: int, decay: float) -> None:
        """One pass's guesses: `tried` up to and including the first wrong one, `right` of them right."""
        self.right = self.right * decay + right
        self.tried = self.tried * decay + tried


@dataclass
class AcceptanceTracker:
    """Per source and match length, the chance p that the next guessed token is right when the
    previous ones were; sending L guesses then yields 1 + p + p^2 + ... + p^L tokens per pass.

    The allocator (runtime.allocator) cuts a guess to the L that maximises tokens per unit of
    pass cost, none when no L beats a plain greedy pass by `margin` (the offer's). Every candidate,
    sent or not, is scored against the tokens the pass committed, so a source that is not being
    sent keeps being measured for free.
    """

    costs: PassCosts = field(default_factory=PassCosts)  # the request's one cost curve, shared by its proposers
    config: LookaheadConfig = field(default_factory=LookaheadConfig)  # the prior, decay, margin (runtime.config)
    rates: dict[tuple[str, int], Rate] = field(default_factory=dict)

    def rate(self, source: str, match_len: int) -> Rate:
        key = (source, min(match_len, self.config.max_match))
        if key not in self.rates:
            self.rates[key] = Rate(self.config.prior * self.config.prior_weight, self.config.prior_weight)
        return self.rates[key]

    def score(self, candidate: Candidate, committed: Sequence[int]) -> None:
        """Learn from one pass: compare the candidate with the tokens the pass committed.

        Guesses up to and including the first wrong one were tried; those after it, or beyond
        the committed tokens, tell nothing and are not counted.
        """
        right = matched_prefix(candidate.tokens, committed)
        tried = right + (right < min(len(candidate.tokens), len(committed)))
        if tried:
            self.rate(candidate.source, candidate.match_len).observe(right, tried, self.config.decay)
