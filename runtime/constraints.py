"""Structured output's request side: a constraint on the text (JSON schema, regex, choice, Lark grammar).

    constraint = Constraint.json_schema(schema)            # checked at once: InputError naming the field

A Constraint holds its grammar in llguidance's form; runtime.grammar compiles it per generation into
a Matcher (token masks, forced runs). The grammar engine is llguidance (guidance-ai; Rust, no Python
dependencies, the engine behind vLLM's, SGLang's and llama.cpp's structured output): an incremental
Earley parser over a token trie. An optional dependency: the `structured` extra.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

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
    def json_object(cls, where: str = "response_format") -> Constraint:
        return cls("json_object", None, where)

    @classmethod
    def json_schema(cls, schema: dict | bool, where: str = "json_schema") -> Constraint:
        return cls("json_schema", schema, where)

    @classmethod
    def regex(cls, pattern: str, where: str = "regex") -> Constraint:
        return cls("regex", pattern, where)

    @classmethod
    def choice(cls, options: Sequence[str], where: str = "choice") -> Constraint:
        return cls("choice", options, where)

    @classmethod
    def lark(cls, grammar: str, where: str = "grammar") -> Constraint:
        return cls("grammar", grammar, where)

    @classmethod
    def from_response_format(cls, value: dict, where: str = "response_format") -> Constraint | None:
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
                raise InputError(
                    f'{where}.json_schema: expected an object like {{"name": "answer", "schema": {{...}}}}'
                )
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
        raise InputError(
            f"{where}: the {'regular expression' if kind == 'regex' else 'grammar'} must be a non-empty string"
        )
    if len(value) > MAX_TEXT:
        raise InputError(f"{where}: {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def _compiled(kind: str, value: Any, where: str) -> str:
    """llguidance's grammar for the constraint, validated (an InputError with llguidance's reason)."""
    llg = require("llguidance", LLGUIDANCE_HINT)
    what = {
        "json_object": "schema",
        "json_schema": "schema",
        "regex": "regular expression",
        "choice": "choices",
        "grammar": "grammar",
    }[kind]
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
        raise InputError(f"{where}: invalid or unsupported {what}: {first_line(messages[0])}")
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


def first_line(message: str) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return " ".join(lines[:4]) if lines else "llguidance gave no reason"
