"""The strategy registry: a strategy's name -> the proposer that runs it.

Adding a strategy is one builder here (and its proposer's own module). Every builder reads one
`ProposerInputs` record and the request's one target cost curve, shared by all the proposer's
parts. Where the backend's windows may not branch (`BackendLimits.branches`), every proposer sends
one chain a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .acceptance import AcceptanceTracker, PassCosts
from .auto import ArmHistory, AutoProposer
from .backends.base import Backend
from .config import DecodingConfig
from .proposers import JacobiProposer, LookaheadProposer, NoProposer, Proposer, UnionProposer


@dataclass(frozen=True)
class ProposerInputs:
    """What a request's proposer is built from."""

    config: DecodingConfig  # the request's
    capacity: int  # the row's context (a draft's cache is opened this large)
    branches: bool  # the backend's windows may branch
    draft: Backend | None  # the draft model, where one is loaded
    prefill_chunk: int  # the generator's prefill chunk (a draft's is capped by its own backend's)
    arm_history: ArmHistory  # `auto`'s record, across calls, of the arms that lost


def _lookahead(inputs: ProposerInputs, costs: PassCosts, most: int | None = None) -> LookaheadProposer:
    most = inputs.config.lookahead.branches if most is None else most
    return LookaheadProposer(most if inputs.branches else 1, AcceptanceTracker(costs, inputs.config.lookahead))


def _draft(inputs: ProposerInputs, costs: PassCosts) -> Proposer:
    from .draft import DraftProposer  # loaded when a draft is used
    from .draft_length import DraftLength

    draft, config = inputs.draft, inputs.config.draft
    chunk = min(inputs.prefill_chunk, draft.limits.prefill_chunk)
    return DraftProposer(
        draft,
        inputs.capacity,
        config,
        prefill_chunk=chunk,
        length=DraftLength(costs, config),
        max_window=draft.limits.max_window,
    )


def _greedy(inputs: ProposerInputs, costs: PassCosts) -> Proposer:
    return NoProposer()


def _jacobi(inputs: ProposerInputs, costs: PassCosts) -> Proposer:
    return JacobiProposer(AcceptanceTracker(costs, inputs.config.lookahead))


def _auto(inputs: ProposerInputs, costs: PassCosts) -> Proposer:
    """Lookahead and a draft arm, the pass going to the better offer; lookahead alone without a draft."""
    if inputs.draft is None:
        return _lookahead(inputs, costs)
    auto = dict(config=inputs.config.auto, history=inputs.arm_history)
    if not inputs.branches:
        return AutoProposer({"lookahead": _lookahead(inputs, costs, 1), "draft": _draft(inputs, costs)}, **auto)
    # the draft's chain plus one prompt-lookup/n-gram branch when it pays: copies stay cheap
    drafting = UnionProposer({"draft": _draft(inputs, costs), "lookahead": _lookahead(inputs, costs, 1)})
    return AutoProposer({"lookahead": _lookahead(inputs, costs), "draft": drafting}, **auto)


PROPOSERS: dict[str, Callable[[ProposerInputs, PassCosts], Proposer]] = {
    "greedy": _greedy,
    "jacobi": _jacobi,
    "lookahead": _lookahead,
    "speculative": _draft,
    "auto": _auto,
}
STRATEGIES = tuple(PROPOSERS)


def build_proposer(strategy: str, inputs: ProposerInputs) -> Proposer:
    """The strategy's proposer, tuned by the request's config, with one cost curve for all its parts."""
    return PROPOSERS[strategy](inputs, PassCosts(inputs.config.costs))
