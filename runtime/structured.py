"""Structured output as one stage of a row's pass: the Row calls its stage's hooks, knowing no grammar.

Free text (`OutputStage` itself) passes everything through. A `GrammarStage` (runtime/grammar.py's Matcher
at work) acts at both ends of a pass:

    before   forced(want)          the tokens the grammar forces next: a sure guess, sent first
             offer(offer, forced)  every guess of the proposer's offer (made past the forced run) cut to
                                   the grammar, the run prepended: what the allocator sees
             split(allocation)     the forced tokens sent, and the proposer's share of the allocation
             guesses(forced, g)    the window's guesses, each continuing the forced run
             masks(tree)           each node's allowed tokens (the picks are made among them)
    after    commit(new, path)     the grammar advanced past the committed tokens; the one EOS a finished
                                   grammar allows is committed at once, without a pass

Every mask depends only on the committed tokens and the node's ancestors, so each pick is one-token
constrained decoding's and every strategy stays exact.
"""

from __future__ import annotations

from .allocator import Allocation, Offer
from .grammar import ConstrainedOffer, Masks, Matcher
from .tree import Tree


class OutputStage:
    """A row's output without a grammar: every hook leaves what it is given as it is."""

    wants_logits = False  # the picks need the logits on the host (a masked pick may not be the in-graph one)

    def forced(self, want: int) -> list[int]:
        return []

    def offer(self, offer: Offer, forced: list[int]) -> Offer:
        return offer

    def split(self, allocation: Allocation) -> tuple[list[int], Allocation]:
        return [], allocation

    def guesses(self, forced: list[int], guesses: list[list[int]]) -> list[list[int]]:
        return guesses

    def masks(self, tree: Tree, forced: list[int]) -> Masks | None:
        return None

    def first_masks(self, last_prompt_token: int) -> Masks | None:
        return None

    def commit(self, new: list[int], path: list[int], room: int) -> list[int]:
        return new

    def stats(self) -> dict | None:
        return None


class GrammarStage(OutputStage):
    """A row's output under a grammar. `eos_ids`: the tokens that end it; `logprobs`: the caller records
    logprobs (an EOS committed without a pass would have none)."""

    wants_logits = True

    def __init__(self, matcher: Matcher, eos_ids: set[int], logprobs: bool):
        self.matcher = matcher
        self.eos_ids = eos_ids
        self.logprobs = logprobs
        self._constrained: ConstrainedOffer | None = None  # where the last offer's guesses came from
        self._forced_nodes = 0  # of the planned window: the forced run's nodes (1..F)

    def forced(self, want: int) -> list[int]:
        return self.matcher.forced(want - 1) if want > 1 else []

    def offer(self, offer: Offer, forced: list[int]) -> Offer:
        self._constrained = self.matcher.constrain(offer, forced)
        return self._constrained.offer

    def split(self, allocation: Allocation) -> tuple[list[int], Allocation]:
        return self._constrained.split(allocation)

    def guesses(self, forced: list[int], guesses: list[list[int]]) -> list[list[int]]:
        """Each guess continues the forced run (a draft's chain is cut here); the run alone without one."""
        return [g[: self.matcher.cut(g)] for g in ([*forced, *g] for g in guesses)] or [forced]

    def masks(self, tree: Tree, forced: list[int]) -> Masks:
        masks = self.matcher.masks(tree.tokens, tree.parents)
        self._forced_nodes = min(len(forced), len(tree.tokens) - 1)  # nodes 1..F: the forced run, the first chain
        cost = self.matcher.cost
        cost.forced_sent += self._forced_nodes
        if forced:
            cost.past_forced_sent += len(tree.tokens) - 1 - self._forced_nodes
        return masks

    def first_masks(self, last_prompt_token: int) -> Masks:
        return self.matcher.masks([last_prompt_token], [-1])

    def commit(self, new: list[int], path: list[int], room: int) -> list[int]:
        """Advance the grammar past the committed tokens (through the first EOS). Where the grammar then
        allows nothing but the one EOS, that EOS is committed now, without a pass (the pick a pass would
        make), if `room` (tokens left to max_new_tokens) takes it and no logprobs need its logits."""
        cut = next((i for i, t in enumerate(new) if t in self.eos_ids), len(new) - 1)
        new = new[: cut + 1]
        m = self.matcher
        m.commit(new)
        m.cost.forced_committed += sum(1 for node in path if node <= self._forced_nodes)
        if m.finished and not m.ended and len(self.eos_ids) == 1 and len(new) < room and not self.logprobs:
            eos = next(iter(self.eos_ids))
            m.commit([eos])
            new = [*new, eos]
        return new

    def stats(self) -> dict:
        cost = self.matcher.cost
        return {
            "mask_seconds": round(cost.seconds, 6),
            "mask_rows": cost.rows,
            "forced_sent": cost.forced_sent,
            "forced_committed": cost.forced_committed,
            "past_forced_sent": cost.past_forced_sent,
            "complete": self.matcher.can_stop,
        }
