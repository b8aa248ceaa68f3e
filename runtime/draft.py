"""Speculative decoding with a draft model: a cheaper model of the same vocabulary guesses the next K tokens.

The draft runs autoregressively on a row of draft slots (its own KV cache; runtime.draft_slots
runs and times its passes), the target verifies the K guesses in one pass, and the draft's cache
is rolled back to what the target committed. The output is the target's own (greedy, or sampled
for the seed) whatever the draft says; the draft only decides how many target passes it takes.

    proposer = DraftProposer(draft_backend, capacity=len(prompt) + max_new_tokens, config=DraftConfig(length=4))
    ... the batcher's row runs it: windows of up to config.max_length + 1 ...
    proposer.close()

The draft's offer is a chain whose tokens do not exist yet (`Guess.tokens` None, `Guess.producer` the
draft): the allocator sizes it, and the batcher's draft step (`produce`, once a pass, for every row)
fills each sized chain, the drafts seated on one DraftSlots together in batched draft passes
(runtime/draft_slots.py runs and times the passes; this module decides what they feed).

The draft's cache holds the KV of a prefix of the committed sequence (`tokens`) and, between
the draft step and `observe`, of the sent chain's first K-1 tokens. Committed tokens the draft has
not run yet (the last one always; two when every guess was accepted; more after the draft sat
out some passes) are fed as one window at the start of the next proposal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .acceptance import PassCosts, matched_prefix
from .allocator import Guess, Offer
from .backends.base import PREFILL_CHUNK, Backend
from .config import DEFAULTS, DraftConfig
from .draft_length import DraftLength
from .draft_slots import CATCHUP, SPARE, DraftRow, DraftSlots
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
        self.chain: list[int] = []  # the guesses sent in the pass being verified (filled by `produce`)
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
        in its first pass, so the chain continues it): a guess this draft produces once it is sized."""
        self.after, self.chain = list(after), []
        limit = min(limit, self._room()) if self.usable else 0  # what the draft's own cache can hold
        if after and self.max_window is not None and min(CATCHUP, self.max_window) + len(after) > self.max_window:
            limit = 0  # the pending tokens (at most CATCHUP, `window`) and the run would not fit the first pass
        if self.k is None:
            offer = self.length.offer(limit)
        else:
            k = min(self.k, limit)  # a fixed K: sent whole
            offer = Offer((Guess((self.length.p,) * k, cost=self.length.relative_cost),), fixed=True) if k else Offer()
        return replace(offer, guesses=tuple(replace(g, producer=self) for g in offer.guesses))

    @property
    def own_seconds(self) -> float:
        return self.stats["draft_seconds"] - self.catchup_seconds

    def cost_curves(self) -> list[PassCosts]:
        return [self.length.costs]

    def observe(self, result: PassResult) -> None:
        tree, predictions, committed = result.tree, result.predictions, result.committed
        if self.k is None and result.sent is not None and result.sent.limit >= 1:
            self.length.sent(result.sent.sent)  # 0: the draft sat out a pass that had room for it
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


def produce(wants: list[tuple[DraftProposer, int]]) -> None:
    """The draft step, once a pass (the batcher's, before the pass is planned): fill each (draft, K) chain the
    allocator sized. The drafts seated on one DraftSlots run together: the catch-ups, one batched pass for the
    first tokens, then one per further token; a draft on slots of its own runs alone."""
    groups: dict[DraftSlots, list[tuple[DraftProposer, int]]] = {}
    for draft, k in wants:
        groups.setdefault(draft.row.slots, []).append((draft, k))
    for slots, wanted in groups.items():
        _fill(slots, wanted)


def _fill(slots: DraftSlots, wanted: list[tuple[DraftProposer, int]]) -> None:
    _catch_up(slots, [draft for draft, _ in wanted])
    firsts = [(draft, k, *draft.window(k)) for draft, k in wanted]
    windows = {draft.row.row: window for draft, _, window, _, _ in firsts}
    befores = [draft.before(draft.known, pending - 1) for draft, _, _, pending, _ in firsts]
    out, lo, seconds = slots.forward(windows, any(b is not None for b in befores))
    keeps = [[] for _ in range(out.greedy_ids.shape[0])]
    for (draft, k, window, pending, guesses), before in zip(firsts, befores):
        i = draft.row.row - lo
        ids = draft.picks(window, out.greedy_ids[i], _row(out.logits, i), pending - 1, before)
        draft.chain.extend(draft.first_chain(pending, guesses, ids, k))
        keeps[i] = list(range(pending + len(draft.chain) - 1))
    slots.commit_each(keeps)
    _charge([draft for draft, *_ in firsts], seconds, narrow=max(map(len, windows.values())) <= 2)
    while active := [draft for draft, k in wanted if len(draft.chain) < k]:
        befores = [draft.before([*draft.known, *draft.chain], 0) for draft in active]
        out, lo, seconds = slots.forward(
            {d.row.row: [d.chain[-1]] for d in active}, any(b is not None for b in befores)
        )
        keeps = [[] for _ in range(out.greedy_ids.shape[0])]
        for draft, before in zip(active, befores):
            i = draft.row.row - lo
            draft.chain.append(draft.picks([draft.chain[-1]], out.greedy_ids[i], _row(out.logits, i), 0, before)[0])
            keeps[i] = [0]
        slots.commit_each(keeps)
        _charge(active, seconds, narrow=True)
    for draft, _ in wanted:
        draft.stats["proposed"] += len(draft.chain)


def _catch_up(slots: DraftSlots, drafts: list[DraftProposer]) -> None:
    """Feed the drafts with more than CATCHUP pending tokens (a new row's prompt, or what the target committed
    while its draft sat out) all but their last, together, in prefill chunks (of at most SPARE tokens when
    other rows may run a pad)."""
    late = [d for d in drafts if len(d.tokens) - d.row.length > min(CATCHUP, d.max_window or CATCHUP)]
    while late:
        chunk = min(*(d.prefill_chunk for d in late), *(d.max_window or d.prefill_chunk for d in late))
        chunk = chunk if slots.lone else min(chunk, SPARE)
        windows = {d.row.row: d.tokens[d.row.length : len(d.tokens) - 1][:chunk] for d in late}
        out, lo, seconds = slots.forward(windows, False)
        keeps = [[] for _ in range(out.greedy_ids.shape[0])]
        for d in late:
            keeps[d.row.row - lo] = list(range(len(windows[d.row.row])))
        slots.commit_each(keeps)
        _charge(late, seconds, catch_up=True)
        late = [d for d in late if len(d.tokens) - d.row.length > 1]


def _charge(drafts: list[DraftProposer], seconds: float, narrow: bool = False, catch_up: bool = False) -> None:
    """Each draft a pass served pays its share: its draft time, and (1-2 token passes) its cost estimate; a
    catch-up is paid once, not the draft's per-pass cost (`own_seconds` leaves it out)."""
    share = seconds / len(drafts)
    for draft in drafts:
        draft.stats["draft_passes"] += 1
        draft.stats["draft_seconds"] += share
        if catch_up:
            draft.catchup_seconds += share
        elif narrow:
            draft.length.observe_draft(share)


def _row(logits: np.ndarray | None, i: int) -> np.ndarray | None:
    return None if logits is None else logits[i]


def seat(slots: DraftSlots, proposer: Proposer) -> None:
    """Seat the drafts of a row's proposer (a speculative row's, auto's draft arm) on rows of a batcher's draft
    slots, so their passes join the other seated drafts'; one without a free row keeps slots of its own."""
    for draft in drafts_in(proposer):
        if draft.row.slots.lone and (row := slots.free_row()) is not None:
            draft.sit(row)


def drafts_in(proposer: Proposer) -> list[DraftProposer]:
    """The draft proposers inside `proposer`: itself, a union's parts, auto's arms."""
    if isinstance(proposer, DraftProposer):
        return [proposer]
    parts = proposer.parts if isinstance(proposer, Composite) else {}
    return [draft for part in parts.values() for draft in drafts_in(part)]
