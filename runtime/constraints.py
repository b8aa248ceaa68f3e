"""Structured output: a constraint on the text (JSON schema, regex, choice, Lark grammar) as token masks.

Three pieces, from the request to the pass:

    constraint = Constraint.json_schema(schema)            # checked at once: InputError naming the field
    grammars = grammar_tokenizer(tokenizer, vocab, eos)    # llguidance's view of the vocabulary, once per tokenizer
    matcher = grammars.matcher(constraint)                 # one per generation (a row of the batcher)

and per pass, for a window verified as a tree (runtime/tree.py: node 0 the last committed token):

    forced = matcher.forced()              # tokens the grammar alone decides next: a guess right by construction
    guess = guess[:matcher.cut(guess)]     # a guess the grammar rejects is cut before the pass
    masks = matcher.masks(tree.tokens, tree.parents)   # row i: the tokens allowed after node i's prefix
    ...  the pass; each live row's pick is over masks.allowed(i) (sampling.masked_greedy / Sampler.sample) ...
    matcher.commit(verdict.committed)

Each row's mask depends only on the committed tokens and the node's ancestors, so the pick at a
node is the pick one-token constrained decoding makes after the same prefix: every strategy stays
exact. The grammar engine is llguidance (guidance-ai; Rust, no Python dependencies, the engine
behind vLLM's, SGLang's and llama.cpp's structured output): an incremental Earley parser over a
token trie, with consume/rollback (what a tree needs), validate_tokens (cutting guesses) and
compute_ff_tokens (forced tokens). An optional dependency: the `structured` extra.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Sequence, get_args

import numpy as np

from .allocator import Allocation, Guess, Offer
from .errors import InputError, JacobiError, require

LLGUIDANCE_HINT = 'pip install "jacobi-rt[structured]" (or: pip install llguidance)'
Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar"]
KINDS = get_args(Kind)

# JSON on one line with Python's separators and no optional whitespace. Flexible whitespace lets a
# small model spend its tokens on newlines and indentation (a known way for it to never finish),
# and fixed separators make every `", "` and `": "` part of a forced run. A schema's own
# "x-guidance" object overrides these (llguidance applies defaults, then x-guidance).
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_CHOICES = 1024
MAX_TEXT = 100_000  # characters of a regex or grammar; a schema's JSON likewise


class ConstraintError(JacobiError):
    """The batcher fed a matcher a token its grammar does not allow (a bug: picks are masked)."""


@dataclass(frozen=True)
class Constraint:
    """What the output must match, checked when it is made (before any work).

    kind: json_object (any JSON object), json_schema (an object or value following `value`, a
    JSON schema as a dict), regex (`value`: the whole output matches it, Rust regex syntax),
    choice (`value`: a tuple of strings, the output is one of them), grammar (`value`: a Lark
    grammar in llguidance's dialect, or GBNF, which llguidance converts).
    where: how the user named it (`response_format.json_schema.schema`, `--regex`), for messages.
    """

    kind: Kind
    value: Any = None
    where: str = "constraint"
    grammar: str = field(default="", repr=False, compare=False)  # llguidance's grammar, set when checked

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"{self.where}: the constraint kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        value = _checked_value(self.kind, self.value, self.where)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "grammar", _compiled(self.kind, value, self.where))

    @classmethod
    def json_object(cls, where: str = "response_format") -> "Constraint":
        return cls("json_object", None, where)

    @classmethod
    def json_schema(cls, schema: dict | bool, where: str = "json_schema") -> "Constraint":
        return cls("json_schema", schema, where)

    @classmethod
    def regex(cls, pattern: str, where: str = "regex") -> "Constraint":
        return cls("regex", pattern, where)

    @classmethod
    def choice(cls, options: Sequence[str], where: str = "choice") -> "Constraint":
        return cls("choice", options, where)

    @classmethod
    def lark(cls, grammar: str, where: str = "grammar") -> "Constraint":
        return cls("grammar", grammar, where)

    @classmethod
    def from_response_format(cls, value: dict, where: str = "response_format") -> "Constraint | None":
        """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"}, or {"type": "json_schema",
        "json_schema": {"name": ..., "schema": {...}}} (the server checks its other fields: server/structured.py)."""
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object(where)
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise InputError(f'{where}.json_schema: expected an object like {{"name": "answer", "schema": {{...}}}}')
            return cls.json_schema(spec["schema"], f"{where}.json_schema.schema")
        raise InputError(f'{where}: expected {{"type": "text" | "json_object" | "json_schema", ...}}, not {value!r}')


def _checked_value(kind: str, value: Any, where: str) -> Any:
    """The value in its stored form (choice: a tuple), or an InputError saying what is wrong."""
    if kind == "json_object":
        return None
    if kind == "json_schema":
        if isinstance(value, bool):
            value = {} if value else {"not": {}}
        if not isinstance(value, dict):
            raise InputError(f"{where}: a JSON schema must be a JSON object, not {type(value).__name__}")
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: the schema is not plain JSON ({exc})") from None
        if len(text) > MAX_TEXT:
            raise InputError(f"{where}: the schema is {len(text)} characters long; the limit is {MAX_TEXT}")
        return value
    if kind == "choice":
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise InputError(f'{where}: the choices must be a non-empty list of strings, like ["yes", "no"]')
        if len(value) > MAX_CHOICES:
            raise InputError(f"{where}: at most {MAX_CHOICES} choices, not {len(value)}")
        for i, option in enumerate(value):
            if not isinstance(option, str) or not option:
                raise InputError(f"{where}.{i}: each choice must be a non-empty string, not {option!r}")
        return tuple(value)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: the {'regular expression' if kind == 'regex' else 'grammar'} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise InputError(f"{where}: {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def _compiled(kind: str, value: Any, where: str) -> str:
    """llguidance's grammar for the constraint, validated (an InputError with llguidance's reason)."""
    llg = require("llguidance", LLGUIDANCE_HINT)
    what = {"json_object": "schema", "json_schema": "schema", "regex": "regular expression", "choice": "choices",
            "grammar": "grammar"}[kind]
    try:
        if kind in ("json_object", "json_schema"):
            schema = {"type": "object"} if kind == "json_object" else value
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORMAT)
        elif kind == "regex":
            grammar = llg.LLMatcher.grammar_from_regex(value)
        elif kind == "choice":
            # Lark string literals take JSON's escapes, so json.dumps quotes any text exactly
            grammar = llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in value))
        else:
            grammar = llg.LLMatcher.grammar_from_lark(_as_lark(llg, value, where))
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    except ValueError as exc:
        raise InputError(f"{where}: invalid {what} ({exc})") from None
    if failed:
        raise InputError(f"{where}: invalid or unsupported {what}: {_first_line(messages[0])}")
    return grammar


def _as_lark(llg, text: str, where: str) -> str:
    """Lark as it is; GBNF (llama.cpp's `root ::= ...`) converted by llguidance's own converter."""
    if "::=" not in text:
        return text
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(text)
    except Exception as exc:  # the converter raises bare Exceptions on bad input
        raise InputError(f"{where}: invalid GBNF grammar ({exc})") from None


def _first_line(message: str) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:4]) if lines else "llguidance gave no reason"


# -- the tokenizer bridge --------------------------------------------------------------------------

class GrammarTokenizer:
    """llguidance's view of a vocabulary (its token trie): built once per tokenizer, shared by threads.

    vocab_size: the model's logits width (may exceed the tokenizer's: the extra ids are never allowed).
    eos_ids: the tokens that end a generation; allowed exactly where the grammar is complete.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]):
        llg = require("llguidance", LLGUIDANCE_HINT)
        if not eos_ids:
            raise InputError("constrained decoding needs the artifact's end-of-sequence token (manifest tokens.eos_ids)")
        self.vocab_size = int(vocab_size)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.words = (self.vocab_size + 31) // 32  # int32 words of one bitmask row
        self._llg = llg
        self._tok = llg.LLTokenizer(tokenizer_json, n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids))

    def matcher(self, constraint: Constraint) -> "Matcher":
        """A fresh matcher at the start of the constrained output (about 0.5-1 ms for a JSON schema)."""
        inner = self._llg.LLMatcher(self._tok, constraint.grammar, log_level=0)
        if inner.is_error():
            raise InputError(f"{constraint.where}: {_first_line(inner.get_error())}")
        return Matcher(inner, self)

    def text(self, tokens: Sequence[int]) -> str:
        return self._tok.decode_str(list(tokens))


_BRIDGES: "weakref.WeakKeyDictionary[object, GrammarTokenizer]" = weakref.WeakKeyDictionary()
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
        for its `take`: each pick's tokens past the forced run)."""
        run, sent, picks = len(self.forced), 0, []
        for index, n in allocation.picks:
            sent = max(sent, min(n, run))
            if self.origin[index] is not None and n > run:
                picks.append((self.origin[index], n - run))
        return list(self.forced[:sent]), replace(allocation, picks=picks)


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

    def constrain(self, offer: Offer, forced: Sequence[int] = ()) -> "ConstrainedOffer":
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
