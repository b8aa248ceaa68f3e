"""PassResult: what one target pass did for one row, measured once and handed to everything that learns.

The batcher (runtime/batcher.py, for a lone generation too) times the target's forward once and
builds one PassResult per row per pass. The proposer (`observe`), the window policy and every cost
model learn from it, so none of them times the pass on its own by bracketing offer() and observe()
(which also counted the loop's bookkeeping as pass time).
"""

from __future__ import annotations

from dataclasses import dataclass

from .allocator import Allocation
from .tree import Tree, Verdict


@dataclass(frozen=True)
class PassResult:
    tree: Tree  # the row's window: the last committed token and the guesses verified with it
    predictions: list[int]  # the target's token at each tree node (greedy, or sampled from its prefix)
    verdict: Verdict  # what the pass committed, and which window rows' KV were kept
    window: int  # the row's window: len(tree.tokens)
    seconds: float  # the target's forward, timed once around it (in a batched pass: the whole pass)
    rows: int  # rows in the forward: 1 for a generation alone, more in a batched pass
    # the forward's width: the window, or in a batched pass the rows' padded width ((rows, width): the cost curve's key)
    width: int
    # the allocation of this proposer's offer that the pass sent (its guesses' lengths); None: its offer was not
    # the one allocated (an arm `auto` did not choose this pass)
    sent: Allocation | None = None

    @property
    def committed(self) -> list[int]:
        return self.verdict.committed


def pass_result(
    tree: Tree,
    predictions: list[int],
    verdict: Verdict,
    seconds: float,
    rows: int = 1,
    width: int | None = None,
    sent: Allocation | None = None,
) -> PassResult:
    """A PassResult for `tree`; by default a pass of this row alone (`width`: its window)."""
    window = len(tree.tokens)
    return PassResult(tree, predictions, verdict, window, seconds, rows, window if width is None else width, sent)
