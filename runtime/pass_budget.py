"""PassBudget: what a pass costs, priced: its width for the rows' bids and its prefill split (the batcher schedules).

A pass over k rows padded to one window W costs cost(k, W) from the measured cost curve
(`PassCosts`, keyed by (rows, width): 16 rows x 2 cost more than one row of 32), so the allocator
picks the pass's window: every row gets its next token first; a wider window is taken only when
the rows' offers pay for it:

    value(W) = sum_b expected_b(W) / (cost(k, W) + sum_b production_b(W))

over W in {1, 2, 4, 8, 16, 32, the widest asked} and each row's sure width (`Bid.sure`: the window that
holds a grammar's forced run, where that row's expected tokens step by its whole run).
expected_b(W) and production_b(W) are the expected committed tokens and guess-production cost of
what row b would send in min(W, wanted_b) tokens: its proposer's offer cut by the allocator
(runtime.allocator.allocate, the rule a single generation uses), for every strategy (a union's
offer is its parts' guesses, auto's its chosen arm's). A lone row gets the window it asks for (its
own policy and offer decide, exactly as a single generation does); as rows join, the guesses
shrink toward greedy because wider rows grow the cost faster than they pay. Prefill passes take
at most `prefill_tokens` tokens in all, first come first served (`prefill_pass`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .acceptance import PassCosts
from .allocator import Cost, Offer, allocate
from .config import BATCH_PASS_COSTS as BATCH_PASS_COSTS  # the prior, re-exported
from .config import DecodingConfig


@dataclass
class Bid:
    """What one decoding row asks of a pass: its widest window, its proposer's offer and the one-row
    cost curve the offer is cut against (the allocator's rule, as in a single generation)."""

    want: int
    offer: Offer
    cost: Cost
    _memo: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)

    def expected(self, width: int) -> tuple[float, float]:
        """Expected committed tokens at a pass `width` wide, and what producing its guesses costs."""
        w = min(width, self.want)
        if w not in self._memo:  # every width past `want` gives the same
            allocation = allocate(self.offer, w - 1, self.cost)
            self._memo[w] = allocation.expected, allocation.production
        return self._memo[w]

    @property
    def sure(self) -> int:
        """The window holding its offer's sure run after the last token (`Guess.free`: a grammar's forced tokens,
        right by construction): every width below it leaves some of the run for later passes."""
        return min(self.want, 1 + max((guess.free for guess in self.offer.guesses), default=0))


@dataclass
class PassBudget:
    prefill_tokens: int = 256  # tokens of one prefill pass, all rows together
    costs: PassCosts = field(default_factory=PassCosts)

    @classmethod
    def of(cls, config: DecodingConfig, prefill_chunk: int) -> PassBudget:
        """The budget `config` sets (batch.prefill_tokens, the cost curve) for a backend's prefill chunk."""
        return cls(config.batch.prefill_tokens or max(prefill_chunk, 16), PassCosts(config.costs))

    def decode_window(self, bids: list[Bid]) -> int:
        if len(bids) == 1:
            return bids[0].want  # a lone row decodes exactly as a single generation would
        k, widest = len(bids), max(bid.want for bid in bids)
        best, best_value = 1, -1.0
        for w in sorted(w for w in {1, 2, 4, 8, 16, 32, widest, *(bid.sure for bid in bids)} if 0 < w <= widest):
            gain, production = map(sum, zip(*(bid.expected(w) for bid in bids)))
            value = gain / (self.costs(w, k) + production)
            if value >= best_value:  # ties go to the wider window: its guesses come free
                best, best_value = w, value
        return best

    def prefill_pass(self, needs: list[int], chunk: int) -> tuple[int, int]:
        """A prefill pass, first come first served: (how many slots it covers, its width).

        needs: from the first prefilling slot on, in slot order (arrival order), each slot's prompt
        tokens left, 0 for a decoding row (it takes part at the pass's width). The first row gets up to
        a chunk; the next ones join while rows x width stays within `prefill_tokens`, so an early
        request reaches its first token first and a burst of long prompts never makes one long pass.
        """
        width, n = min(chunk, needs[0]), 1
        while n < len(needs):
            wider = max(width, min(chunk, needs[n]))
            if (n + 1) * wider > self.prefill_tokens:
                break
            n, width = n + 1, wider
        while needs[n - 1] == 0:  # end on a prefilling row
            n -= 1
        return n, width

    def observe(self, shape: tuple[int, int], seconds: float) -> None:
        rows, width = shape  # a pass of this shape took `seconds`
        self.costs.observe(width, seconds, rows)
