"""DraftLength: how many tokens a draft sends a pass, K chosen by the one length rule (runtime.allocator)
against the target's measured pass costs and the draft's measured pass time, with a probe now and then."""

from __future__ import annotations

from dataclasses import dataclass, field

from .acceptance import PassCosts, Rate
from .allocator import Guess, Offer
from .config import DraftConfig


@dataclass
class DraftLength:
    """How many draft tokens to send: the K that maximises expected committed tokens per unit of time.

    With per-token acceptance p (the chance a guess is right when the ones before it were), K
    guesses commit 1 + p + ... + p^K tokens per target pass and cost costs(K+1) target
    W=1 passes plus K draft passes of relative cost c (both measured online). `offer` hands the
    allocator that chain; it cuts K by the one length rule, K = 0 (a plain greedy pass, no draft)
    when no K beats greedy by `margin`; then every `probe_every` target passes its offer is a probe,
    sent whatever its gain, since acceptance and costs drift with the text and context.
    """

    costs: PassCosts = field(default_factory=PassCosts)  # target pass costs, learned on this machine
    config: DraftConfig = field(default_factory=DraftConfig)  # priors, decay, margin, probes (runtime.config)
    acceptance: Rate = field(init=False)  # per draft token, from the config's prior
    draft_seconds: float | None = None  # one draft pass
    idle: int = 0  # target passes since the draft last proposed

    def __post_init__(self) -> None:
        self.acceptance = Rate(self.config.prior_acceptance * self.config.prior_weight, self.config.prior_weight)

    @property
    def p(self) -> float:
        return self.acceptance.p

    @property
    def relative_cost(self) -> float:
        """One draft pass in target W=1 passes."""
        unit = self.costs.unit_seconds()
        if self.draft_seconds is None or not unit:  # untimed, or a clock too coarse to time a target pass
            return self.config.prior_cost
        return self.draft_seconds / unit

    def offer(self, limit: int) -> Offer:
        """One chain of up to min(config.max_length, limit) draft tokens, each right with chance p, each costing a
        draft pass: the allocator cuts it by the one length rule, or drops it when it does not beat
        greedy by `margin`. After `probe_every` - 1 passes without the draft, the chain is a probe: sent
        at its best length whatever its gain (the text may have become predictable)."""
        limit = min(self.config.max_length, limit)
        if limit < 1:
            return Offer()
        probe = -1.0 if self.idle + 1 >= self.config.probe_every else None
        return Offer((Guess((self.p,) * limit, cost=self.relative_cost, margin=probe),), margin=self.config.margin)

    def sent(self, k: int) -> None:
        """The allocator sent k draft tokens this pass (0: the draft sat out)."""
        self.idle = 0 if k else self.idle + 1

    def observe_acceptance(self, sent: int, accepted: int) -> None:
        self.acceptance.observe(accepted, accepted + (accepted < sent), self.config.decay)

    def observe_draft(self, seconds: float) -> None:
        a, old = self.config.smoothing, self.draft_seconds
        self.draft_seconds = seconds if old is None else (1 - a) * old + a * seconds
