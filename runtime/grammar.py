"""A constraint's grammar at work: llguidance's view of the vocabulary, and each row's Matcher.

    grammars = grammar_tokenizer(tokenizer, vocab, eos)    # once per tokenizer
    matcher = grammars.matcher(constraint)                 # one per generation (a row of the batcher)

Per pass (a window verified as a tree: runtime/tree.py), the matcher gives the forced run, cuts
guesses to the grammar, gives each node's mask, and commits what the pass accepted; each mask
depends only on the committed tokens and the node's ancestors, so every strategy stays exact.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .allocator import Allocation, Guess, Offer
from .constraints import LLGUIDANCE_HINT, Constraint, ConstraintError, first_line
from .errors import InputError, require

# -- the tokenizer bridge --------------------------------------------------------------------------


class GrammarTokenizer:
    """llguidance's view of a vocabulary (its token trie): built once per tokenizer, shared by threads.

    vocab_size: the model's logits width (may exceed the tokenizer's: the extra ids are never allowed).
    eos_ids: the tokens that end a generation; allowed exactly where the grammar is complete.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]):
        llg = require("llguidance", LLGUIDANCE_HINT)
        if not eos_ids:
            raise InputError(
                "constrained decoding needs the artifact's end-of-sequence token (manifest tokens.eos_ids)"
            )
        self.vocab_size = int(vocab_size)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.words = (self.vocab_size + 31) // 32  # int32 words of one bitmask row
        self._llg = llg
        self._tok = llg.LLTokenizer(tokenizer_json, n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids))

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher at the start of the constrained output (about 0.5-1 ms for a JSON schema)."""
        inner = self._llg.LLMatcher(self._tok, constraint.grammar, log_level=0)
        if inner.is_error():
            raise InputError(f"{constraint.where}: {first_line(inner.get_error())}")
        return Matcher(inner, self)

    def text(self, tokens: Sequence[int]) -> str:
        return self._tok.decode_str(list(tokens))


_BRIDGES: weakref.WeakKeyDictionary[object, GrammarTokenizer] = weakref.WeakKeyDictionary()
_BRIDGES_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> GrammarTokenizer:
    """The GrammarTokenizer of a runtime Tokenizer, built on first use (~0.3 s for SmolLM2's
    49,152 tokens) and kept as long as the tokenizer lives."""
    with _BRIDGES_LOCK:
        bridge = _BRIDGES.get(tokenizer)
        if bridge is None:
            bridge = _BRIDGES[tokenizer] = GrammarTokenizer(tokenizer.json(), vocab_size, eos_ids)
        return bridge


# -- one generation's grammar state ---------------------------------------------------------------


@dataclass
class Masks:
    """The allowed tokens after each node of a window: row i for the pick at node i.

    bits: int32 [W, words], bit t % 32 of word t // 32 set when token t is allowed (llguidance's layout).
    live: bool [W]. A node is dead when its own token is not allowed after its parent (or follows an
    EOS): the accept walk can never reach it, since every pick is allowed, so its row is all ones and
    its pick is never read.
    """

    bits: np.ndarray
    live: np.ndarray
    vocab_size: int
    seconds: float = 0.0  # time spent computing them

    def allowed(self, node: int) -> np.ndarray:
        """bool [vocab]: may token t follow node `node`'s prefix."""
        return np.unpackbits(self.bits[node].view(np.uint8), count=self.vocab_size, bitorder="little").astype(bool)

    def allows(self, node: int, token: int) -> bool:
        return bool((int(self.bits[node, token >> 5]) >> (token & 31)) & 1)


@dataclass
class MaskCost:
    """What the masks cost a generation: for the batcher's pass costs and the stats."""

    seconds: float = 0.0
    rows: int = 0  # mask rows computed (live nodes)
    windows: int = 0  # calls of masks()
    forced_sent: int = 0  # forced tokens put in windows (the batcher counts them)
    forced_committed: int = 0  # of those, committed
    past_forced_sent: int = 0  # proposers' guessed tokens sent after a forced run (Proposer.offer(after=...))


@dataclass(frozen=True)
class ConstrainedOffer:
    """An offer under a constraint: what the allocator sees, and where each of its guesses came from.

    With a forced run, every guess starts with it: the run alone, or the run followed by one of the
    proposer's guesses past it (made as if the run were committed: Proposer.offer(limit, after=forced)).
    """

    offer: Offer
    origin: tuple[int | None, ...]  # per guess: its index in the proposer's offer; None: the forced run alone
    forced: tuple[int, ...]  # the tokens the grammar forces next

    def split(self, allocation: Allocation) -> tuple[list[int], Allocation]:
        """(the forced tokens the pass sends, the rest as an allocation of the proposer's own offer,
        the pass sends of its guesses and its result carries back: each pick's tokens past the forced run)."""
        run, sent, picks = len(self.forced), 0, []
        for index, n in allocation.picks:
            sent = max(sent, min(n, run))
            if self.origin[index] is not None and n > run:
                picks.append((self.origin[index], n - run))
        return list(self.forced[:sent]), replace(allocation, picks=picks, limit=max(0, allocation.limit - sent))


class Matcher:
    """The grammar's state after a generation's committed tokens. Not thread-safe: one per row.

    Every method leaves the state as it found it except `commit`, so the batcher may ask for forced
    tokens, cuts and masks in any order before a pass.
    """

    def __init__(self, inner, bridge: GrammarTokenizer):
        self._m = inner
        self.bridge = bridge  # the vocabulary: its size, its EOS ids
        self.ended = False  # an EOS was committed
        self.cost = MaskCost()

    @property
    def can_stop(self) -> bool:
        """The output so far is complete: EOS is allowed here."""
        return self.ended or self._m.is_accepting()

    @property
    def finished(self) -> bool:
        """Nothing but EOS can follow (or EOS was committed): the batcher may end the row without a pass."""
        return self.ended or self._m.is_stopped()

    def forced(self, limit: int | None = None) -> list[int]:
        """The tokens the grammar decides alone from here (llguidance's fast-forward tokens), at most
        `limit`. The model may still pick another tokenization of the same bytes, so a forced guess
        is checked by the pass like any other; empty when the next token is not decided."""
        if self.finished:
            return []
        tokens = [int(t) for t in self._m.compute_ff_tokens()]
        return tokens if limit is None else tokens[:limit]

    def cut(self, guess: Sequence[int]) -> int:
        """How many of the guess's first tokens the grammar accepts after the committed tokens
        (an EOS counts where the grammar is complete; nothing after it does)."""
        if self.ended:
            return 0
        guess = [int(t) for t in guess]
        stop = next((i for i, t in enumerate(guess) if t in self.bridge.eos_ids), len(guess))
        n = self._m.validate_tokens(guess[:stop]) if stop else 0
        if n < stop or stop == len(guess):
            return n
        # llguidance does not count an EOS after a complete output in validate_tokens: ask directly
        if not self._m.consume_tokens(guess[:stop]):
            raise ConstraintError(f"llguidance refused tokens it had validated: {self._m.get_error()}")
        complete = self._m.is_accepting()
        self._rollback(stop)
        return stop + 1 if complete else stop

    def constrain(self, offer: Offer, forced: Sequence[int] = ()) -> ConstrainedOffer:
        """A proposer's offer as a constrained row may send it (runtime/allocator.py decides how much).

        `forced`: the run the grammar forces next (`forced()`), and `offer` the proposer's guesses past it
        (Proposer.offer(limit, after=forced)). Each guess becomes the run followed by the guess, right with
        chance 1 through the run and at its own rates after it (a draft's production paid only past it);
        a guess whose tokens are known is cut to what the grammar accepts and dropped if nothing of it is
        left. A guess made later (tokens None: a draft's chain) passes as it is: `cut` it once it exists.
        With no guess left, the run alone is the offer."""
        forced = tuple(int(t) for t in forced)
        run = len(forced)
        guesses: list[Guess] = []
        origin: list[int | None] = []
        for index, guess in enumerate(offer.guesses):
            tokens = None
            if guess.tokens is not None:
                n = self.cut(forced + tuple(guess.tokens)) - run
                if n < 1:
                    continue
                tokens = forced + tuple(guess.tokens[:n])
            accept = guess.accept if tokens is None else guess.accept[: len(tokens) - run]
            guesses.append(replace(guess, accept=(1.0,) * run + tuple(accept), tokens=tokens, free=guess.free + run))
            origin.append(index)
        if guesses or not forced:
            return ConstrainedOffer(replace(offer, guesses=tuple(guesses)), tuple(origin), forced)
        sure = Guess(accept=(1.0,) * run, tokens=forced, margin=0.0, free=run)
        return ConstrainedOffer(Offer((sure,)), (None,), forced)

    def masks(self, tokens: Sequence[int], parents: Sequence[int]) -> Masks:
        """The mask after each node of a window in depth-first order (runtime/tree.Tree's tokens and
        parents; node 0 the last committed token, which the state already holds).

        Walks the tree once: each node's token is consumed on top of its parent's state and rolled
        back when the walk leaves the node's subtree, so a chain costs one consume and one mask per node.
        """
        start = time.perf_counter()
        width = len(tokens)
        bits = np.full((width, self.bridge.words), -1, dtype=np.int32)
        live = np.zeros(width, dtype=bool)
        masks = Masks(bits, live, self.bridge.vocab_size)
        depth = np.zeros(width, dtype=np.int64)
        consumed = 0  # tokens consumed on top of the committed state: the current node's depth
        for node in range(width):
            parent = int(parents[node])
            if node and not live[parent]:
                continue
            if node:
                token = int(tokens[node])
                depth[node] = depth[parent] + 1
                if token in self.bridge.eos_ids or not masks.allows(parent, token):
                    continue  # an EOS ends the generation there: the row's pick is never committed
                self._rollback(consumed - int(depth[parent]))
                if not self._m.consume_token(token):
                    raise ConstraintError(f"llguidance refused an allowed token {token}: {self._m.get_error()}")
                consumed = int(depth[node])
            elif self.ended:
                continue
            live[node] = True
            self._m.unsafe_compute_mask_ptr(bits[node].ctypes.data, bits[node].nbytes)
        self._rollback(consumed)
        masks.seconds = time.perf_counter() - start
        self.cost.seconds += masks.seconds
        self.cost.rows += int(live.sum())
        self.cost.windows += 1
        return masks

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past the tokens a pass committed (the Verdict's `committed`); an EOS ends the output."""
        for token in tokens:
            token = int(token)
            if self.ended:
                raise ConstraintError(f"token {token} committed after the end of the constrained output")
            if token in self.bridge.eos_ids:
                if not self._m.is_accepting():
                    raise ConstraintError("EOS committed before the constrained output is complete")
                self.ended = True
            elif not self._m.consume_token(token):
                raise ConstraintError(f"token {token} committed against the grammar: {self._m.get_error()}")

    def _rollback(self, n: int) -> None:
        if n and not self._m.rollback(n):
            raise ConstraintError(f"llguidance could not roll back {n} tokens: {self._m.get_error()}")
