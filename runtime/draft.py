"""Speculative decoding with a draft model: a cheaper model of the same vocabulary guesses the next K tokens.

The draft runs autoregressively on a row of draft slots (its own KV cache; runtime.draft_slots
runs and times its passes), the target verifies the K guesses in one pass, and the draft's cache
is rolled back to what the target committed. The output is the target's own (greedy, or sampled
for the seed) whatever the draft says; the draft only decides how many target passes it takes.

    proposer = DraftProposer(draft_backend, capacity=len(prompt) + max_new_tokens, config=DraftConfig(length=4))
    ... the batcher's row runs it: windows of up to config.max_length + 1 ...
    proposer.close()

The draft's cache holds the KV of a prefix of the committed sequence (`tokens`) and, between
`take` and `update`, of the sent chain's first K-1 tokens. Committed tokens the draft has
not run yet (the last one always; two when every guess was accepted; more after the draft sat
out some passes) are fed as one window at the start of the next proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .acceptance import PassCosts, Rate, matched_prefix
from .allocator import Allocation, Guess, Offer
from .backends.base import PREFILL_CHUNK, Backend
from .config import DEFAULTS, DraftConfig
from .draft_slots import CATCHUP, DraftRow, DraftSlots
from .errors import ArtifactError, InputError
from .manifest import Manifest
from .passes import PassResult
from .proposers import Composite, Proposer, close_state
from .tree import Tree


def check_draft(
    target: Manifest, draft: Manifest, target_name: str | None = None, draft_name: str | None = None
) -> None:
    """Refuse a draft whose token ids do not mean the target's: another tokenizer or vocabulary size.

    target_name/draft_name (e.g. the artifact folders) name the two in the message; default the
    manifests' source names.
    """
    t_name = target_name or target.source.get("name", "the target")
    d_name = draft_name or draft.source.get("name", "the draft")
    if target.role == "draft":
        raise InputError(
            f"{t_name} was exported as a draft (--role draft); load a target artifact as the target "
            f"and pass {t_name} as its draft"
        )
    t_sha, d_sha = target.tokenizer.get("vocab_sha256"), draft.tokenizer.get("vocab_sha256")
    if not t_sha or not d_sha:
        missing = t_name if not t_sha else d_name
        raise ArtifactError(
            f"{missing} records no tokenizer vocab_sha256 in its manifest, so its vocabulary cannot be "
            "checked against the other model's; re-export it with this version of jacobi-rt"
        )
    if t_sha != d_sha:
        raise InputError(
            f"draft {d_name} has a different vocabulary from target {t_name}; export the draft from a model "
            "with the same tokenizer (e.g. `jacobi-rt export TARGET --role draft --keep-layers N`)"
        )
    t_vocab, d_vocab = target.architecture.vocab_size, draft.architecture.vocab_size
    if t_vocab != d_vocab:
        raise InputError(
            f"draft {d_name} has {d_vocab} output ids but target {t_name} has {t_vocab} (same tokenizer, "
            "different embedding size); export the draft from a model with the target's vocabulary size"
        )


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


class DraftProposer(Proposer):
    """Guesses from a draft model: one chain of K tokens per target pass, K adapted to what pays.

    backend: the draft's loaded model (check_draft it against the target first).
    capacity: KV entries of the draft's cache (prompt + new tokens, as the target's).
    config: `length`, a fixed number of guesses per pass (0..max_length; None adapts K: DraftLength);
    `jacobi_tail`, speculative Jacobi. The target's predictions past the first rejected guess guess
        the tokens after the new last token (from a wrong prefix, so often wrong); the draft's
        first pass of the next proposal runs them too and keeps those that match its own
        predictions, so it gets several draft tokens from one pass. The guesses sent are the
        draft's own greedy chain either way: only the number of draft passes changes.
    The draft's passes run on `row`, a row of draft slots (runtime.draft_slots): one-row slots of its own,
    or a batcher's (`sit`); this class decides what they run and keeps the cache in step.
    """

    def __init__(
        self,
        backend: Backend,
        capacity: int,
        config: DraftConfig = DEFAULTS.draft,
        prefill_chunk: int = PREFILL_CHUNK,
        length: DraftLength | None = None,
        max_window: int | None = None,
    ) -> None:
        super().__init__()
        self.k, self.jacobi = config.length, config.jacobi_tail  # both checked by DraftConfig
        self.prefill_chunk = prefill_chunk
        self.max_window = max_window  # the draft backend's widest pass (Backend.limits); None: any
        self.length = length or DraftLength(config=config)
        self.row = DraftSlots.row_of_its_own(backend, capacity)
        self.kept: list[int] = []  # an adopted cache's tokens (the conversation's previous turn)
        self.tokens: list[int] = []  # the committed sequence: prompt, then every committed token
        self.chain: list[int] = []  # the guesses sent in the pass being verified
        self.after: list[int] = []  # the tokens the pass sends before the chain (a grammar's forced run)
        self.jacobi_guesses: list[int] = []  # the target's predictions past the last rejected guess
        self.usable = True  # False when the prompt does not fit the draft's cache
        self.sampler = None  # with sampling, the draft samples its chain (use_sampler)
        self.stats = _zero_stats()

    # -- the Proposer interface -------------------------------------------------------------

    def use_sampler(self, sampler) -> None:
        """Sample the chain like the target: coupled (the target's noise g[t], so close models agree
        far more often) or independent (a seed of its own), as the request's coupled_draft says."""
        if sampler is None or sampler.params.coupled_draft:
            self.sampler = sampler
        else:
            self.sampler = sampler.independent()

    def start(self, prompt: list[int], first: int) -> None:
        self.stats = {**_zero_stats(), "jacobi_tail": self.jacobi}
        self.catchup_seconds = 0.0  # counted in stats["draft_seconds"] too: own_seconds takes it out
        self.tokens, self.chain, self.jacobi_guesses, self.after = [*prompt, first], [], [], []
        self.row.trim(min(matched_prefix(self.kept, prompt), self.row.length))  # 0 unless a cache was adopted
        self.stats["cached"], self.kept = self.row.length, []
        self.usable = len(prompt) + 1 < self.row.capacity
        # No prefill here: the first proposal feeds the prompt (in chunks), so a draft that is
        # never asked (K = 0 throughout, or a losing arm of `auto`) costs nothing.

    def offer(self, limit: int, after: Sequence[int] = ()) -> Offer:
        """The chain after the committed tokens, or after them and `after` (the draft runs the forced run
        in its first pass, so the chain continues it)."""
        self.after = list(after)
        limit = min(limit, self._room()) if self.usable else 0  # what the draft's own cache can hold
        if after and self.max_window is not None and min(CATCHUP, self.max_window) + len(after) > self.max_window:
            limit = 0  # the pending tokens (at most CATCHUP, `window`) and the run would not fit the first pass
        if self.k is None:
            return self.length.offer(limit)
        k = min(self.k, limit)  # a fixed K: sent whole
        return Offer((Guess((self.length.p,) * k, cost=self.length.relative_cost),), fixed=True) if k else Offer()

    def take(self, allocation: Allocation, limit: int) -> list[list[int]]:
        """The chain, filled by the draft step of the slots the draft sits on: at once on its own, by the
        batcher's step (before the pass is planned) on a batcher's."""
        k = allocation.picks[0][1] if allocation.picks else 0
        if self.k is None and limit >= 1:
            self.length.sent(k)
        self.chain = []
        if k <= 0:
            return []
        self.row.want(self, k)
        return [self.chain]

    @property
    def own_seconds(self) -> float:
        return self.stats["draft_seconds"] - self.catchup_seconds

    def cost_curves(self) -> list[PassCosts]:
        return [self.length.costs]

    def update(self, result: PassResult) -> None:
        tree, predictions, committed = result.tree, result.predictions, result.committed
        self.jacobi_guesses = []
        if self.chain:
            chain = [*self.after, *self.chain]  # the cache holds tokens + chain[:-1]
            accepted = matched_prefix(chain, committed[:-1])
            if accepted >= len(self.after):  # the draft's own tokens were tried
                self.stats["accepted"] += accepted - len(self.after)
                self.length.observe_acceptance(len(self.chain), accepted - len(self.after))
            # The cache holds tokens + chain[:-1]; keep the chain entries the target committed,
            # but never the new last token's (it stays pending, so its pass yields the next guess).
            valid = min(matched_prefix(chain[:-1], committed), len(committed) - 1)
            self.row.trim(len(self.tokens) + valid)
            if self.jacobi and accepted < len(chain):
                self.jacobi_guesses = _predictions_below(tree, predictions, chain, accepted)
        self.tokens.extend(committed)
        self.chain = []

    def handover(self) -> dict:
        """The draft's cache and the tokens it holds, for the conversation's next turn (a lone draft's own
        row as it is; a batcher's row copied out: the slot goes to the next row)."""
        tokens = self.tokens[: self.row.length]
        kept, self.row = DraftCache(self.row.detach(), tokens), None
        return {"cache": kept}

    def adopt(self, state: dict) -> None:
        kept = state.pop("cache", None)
        close_state(state)
        if kept is None:
            return
        if kept.row.capacity >= self.row.capacity and self.row.slots.lone:
            self.row.close()
            self.row, self.kept = kept.row, kept.tokens
            return
        if self.row.load_prefix(kept.row, len(kept.tokens)):  # the conversation outgrew it: copy the prefix over
            self.kept = kept.tokens
        kept.close()

    def close(self) -> None:
        if self.row is not None:
            self.row.close()
            self.row = None

    def sit(self, row) -> None:
        """Run on `row`, a row of a batcher's draft slots, instead of one-row slots of its own: its passes
        then join the other seated drafts' (before start() and adopt())."""
        self.row.close()
        self.row = row

    # -- what the draft's passes run (DraftSlots runs them) ---------------------------------------

    def _room(self) -> int:
        """The most guesses the draft's cache can hold: pending tokens, the forced run and K-1 guesses must fit."""
        pending = len(self.tokens) - self.row.length + len(self.after)
        return self.row.capacity - self.row.length - pending + 1

    @property
    def known(self) -> list[int]:
        """The tokens the next chain continues: the committed ones and the forced run sent before it."""
        return [*self.tokens, *self.after]

    def window(self, k: int) -> tuple[list[int], int, list[int]]:
        """The first draft pass of a K-token chain, after the catch-up: (its window, how many of its tokens are
        known ones, the pending committed tokens and the forced run, the Jacobi guesses after them)."""
        pending = [*self.tokens[self.row.length :], *self.after]  # a grammar's forced run: run with the pending tokens
        room = k - 1 if self.max_window is None else min(k - 1, self.max_window - len(pending))
        guesses = [] if self.after else self.jacobi_guesses[: max(0, room)]
        return [*pending, *guesses], len(pending), guesses

    def first_chain(self, pending: int, guesses: list[int], ids: list[int], k: int) -> list[int]:
        """The chain the first pass gives: ids[pending - 1] is the draft's token after the last committed one;
        each Jacobi guess that equals the draft's own token there lets the next position's id stand too."""
        chain = [ids[pending - 1]]
        while len(chain) < k and len(chain) <= len(guesses) and guesses[len(chain) - 1] == chain[-1]:
            chain.append(ids[pending + len(chain) - 1])
        self.stats["draft_passes_saved"] += len(chain) - 1
        return chain

    def before(self, sequence: list[int], first: int | None) -> list[int] | None:
        """What precedes the next window (a prefix of `sequence`), when the draft samples it; None: greedy."""
        return list(sequence[: self.row.length]) if self.sampler is not None and first is not None else None

    def picks(
        self,
        window: list[int],
        greedy: np.ndarray,
        logits: np.ndarray | None,
        first: int | None,
        before: list[int] | None,
    ) -> list[int]:
        """The draft's greedy ids after each window row, or with a sampler, from row `first` on, the token
        sampled from its logits (`before`: what precedes the window)."""
        ids = greedy[: len(window)].tolist()
        for row in range(first, len(window)) if before is not None else ():
            prefix = before + window[: row + 1]
            ids[row] = self.sampler.sample(logits[row], prefix, len(prefix))
        return ids


@dataclass
class DraftCache:
    """A draft's cache (a row of one-row draft slots) handed over with the tokens whose KV it holds."""

    row: DraftRow
    tokens: list[int]

    def close(self) -> None:
        self.row.close()


def _zero_stats() -> dict:
    return {"draft_passes": 0, "draft_seconds": 0.0, "proposed": 0, "accepted": 0, "draft_passes_saved": 0}


def _predictions_below(tree: Tree, predictions: list[int], chain: list[int], accepted: int) -> list[int]:
    """The target's predictions at the chain's nodes from the first rejected one on.

    The prediction at rejected node chain[accepted] guesses the token after the new last token
    (the target's correction at that position), and so on down the chain.
    """
    children = {(parent, token): node for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens)) if node}
    node, out = 0, []
    for depth, token in enumerate(chain):
        node = children.get((node, token))
        if node is None:
            break
        if depth >= accepted:
            out.append(int(predictions[node]))
    return out


def drafts_in(proposer: Proposer) -> list[DraftProposer]:
    """The draft proposers inside `proposer`: itself, a union's parts, auto's arms."""
    if isinstance(proposer, DraftProposer):
        return [proposer]
    parts = proposer.parts if isinstance(proposer, Composite) else {}
    return [draft for part in parts.values() for draft in drafts_in(part)]
