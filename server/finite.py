"""Whether a constraint admits any finite output, decided before any work (issue 37).

A schema whose `$ref` points at itself (`{"$ref": "#"}`, or a required property that is the whole
schema again) and a grammar like `root ::= "a" root` compile and validate in llguidance, but no
finite text matches them: the matcher lets generation run until its parser gives up mid-output.
`no_finite_output(grammar)` reads the constraint's llguidance grammar (a JSON schema, or Lark text)
and computes, as a least fixpoint, which rules ($ref targets, Lark rules) can derive a finite string
(a rule is productive when one alternative has only productive parts; optional and starred parts
always are). It names the unproductive start; it answers None (no objection) for anything it does
not read exactly (an external $ref, Lark templates, %regex, sub-grammars), so a valid recursive
schema or grammar (a tree whose children are optional) is never refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any


def no_finite_output(grammar: str) -> str | None:
    """Why no finite output matches `grammar` (llguidance's: JSON with one json_schema, or Lark), or None."""
    if grammar.lstrip().startswith("{"):
        try:
            entries = json.loads(grammar).get("grammars") or []
        except (ValueError, AttributeError):
            return None
        schemas = [e["json_schema"] for e in entries if isinstance(e, dict) and e.get("json_schema") is not None]
        if len(entries) == 1 and schemas and schema_has_instance(schemas[0]) is False:
            return "the schema has no finite instance (a $ref that leads back to itself with nothing to end it)"
        return None
    if lark_has_output(grammar) is False:
        return "the grammar matches no finite string (every way out of the start rule leads back into a rule)"
    return None


# -- JSON schemas -----------------------------------------------------------------------------------


def schema_has_instance(root: Any) -> bool | None:
    """False when no finite JSON value is valid for `root` (as far as its $refs go); None when unsure."""
    targets: dict[str, Any] = {}
    for ref in _refs(root):
        target = _resolve(root, ref)
        if target is _UNKNOWN:
            return None
        targets[ref] = target
    productive: set[str] = set()
    while True:
        grown = {ref for ref, target in targets.items() if ref not in productive and _instance(target, productive)}
        if not grown:
            return _instance(root, productive)
        productive |= grown


_UNKNOWN = object()


def _refs(schema: Any) -> set[str]:
    found, stack = set(), [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("$ref"), str):
                found.add(value["$ref"])
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return _UNKNOWN  # another document: not read here
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _UNKNOWN
    return node


def _instance(schema: Any, productive: set[str]) -> bool:
    """Some finite value is valid for `schema`, given the $refs known to have one (True when unsure)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        return True
    parts = []
    if isinstance(schema.get("$ref"), str):
        parts.append(schema["$ref"] in productive)
    for key, combine in (("anyOf", any), ("oneOf", any), ("allOf", all)):
        if isinstance(schema.get(key), list) and schema[key]:
            parts.append(combine(_instance(s, productive) for s in schema[key]))
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if isinstance(types, list) and types and "enum" not in schema and "const" not in schema:
        parts.append(any(_typed(schema, t, productive) for t in types))
    return all(parts)


def _typed(schema: dict, kind: Any, productive: set[str]) -> bool:
    if kind == "object":
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        extra = schema.get("additionalProperties", True)
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        return all(
            _instance(properties[name] if name in properties else extra, productive)
            for name in required
            if isinstance(name, str)
        )
    if kind == "array":
        least = schema.get("minItems", 0)
        least = least if isinstance(least, int) else 0
        prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
        items = schema.get("items", True)
        needed = prefix[:least] + ([items] if least > len(prefix) else [])
        return all(_instance(s, productive) for s in needed)
    return True


# -- Lark grammars ----------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_\-]*)
  | (?P<repeat>\{\s*\d*\s*(?:,\s*\d*\s*)?\}|~\s*\d+(?:\s*\.\.\s*\d+)?)
  | (?P<op>[|()\[\]?*+])
)""",
    re.X,
)
_RULE = re.compile(r"^[?!]?([a-z_][a-z0-9_\-]*)(?:\.-?\d+)?\s*:(?!:)", re.M)
_TERMINAL = re.compile(r"^[A-Z_][A-Z0-9_\-]*(?:\.-?\d+)?\s*:(?!:)", re.M)
_DIRECTIVES = ("%llguidance", "%ignore", "%import", "%declare")


def lark_has_output(text: str) -> bool | None:
    """False when the start rule derives no finite string; None when the grammar holds what is not read here."""
    rules = _lark_rules(text)
    if rules is None or "start" not in rules:
        return None
    productive: set[str] = set()
    while True:
        grown = {name for name, body in rules.items() if name not in productive and body(productive)}
        if not grown:
            return "start" in productive
        productive |= grown


def _lark_rules(text: str) -> dict[str, Callable[[set[str]], bool]] | None:
    """Each rule's body as a test of whether it derives a finite string (given the productive rules)."""
    lines = []
    for line in _without_comments(text).splitlines():
        if line.startswith("%"):
            if not line.startswith(_DIRECTIVES):
                return None
            continue
        lines.append(line)
    source = "\n".join(lines)
    starts = [(m.start(), m.end(), m.group(1)) for m in _RULE.finditer(source)]
    ends = sorted([s for s, _, _ in starts] + [m.start() for m in _TERMINAL.finditer(source)] + [len(source)])
    rules = {}
    for start, body_start, name in starts:
        body_end = min(e for e in ends if e > start)
        parsed = _parse(source[body_start:body_end])
        if parsed is None or name in rules:
            return None
        rules[name] = parsed
    return rules


def _without_comments(text: str) -> str:
    """The text less // and # comments (not inside strings or regexes)."""
    out = []
    for line in text.splitlines():
        cut, i = len(line), 0
        while i < len(line):
            c = line[i]
            if c in '"/' and not line.startswith("//", i):
                match = _TOKEN.match(line, i)
                if match and (match.group("string") or match.group("regex")):
                    i = match.end()
                    continue
            if c == "#" or line.startswith("//", i):
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def _parse(body: str) -> Callable[[set[str]], bool] | None:
    tokens, pos = [], 0
    while pos < len(body):
        if not body[pos:].strip():
            break
        match = _TOKEN.match(body, pos)
        if not match or match.end() == pos:
            return None  # %json, <[...]> tokens, @grammars, templates ...: not read here
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    parser = _Parser(tokens)
    tree = parser.alternatives()
    return tree if tree is not None and parser.at == len(tokens) else None


class _Parser:
    """Recursive descent over a rule body: alternatives of sequences of (possibly repeated) atoms."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def alternatives(self):
        options = [self.sequence()]
        while self.peek() == ("op", "|"):
            self.at += 1
            options.append(self.sequence())
        if any(o is None for o in options):
            return None
        return lambda p: any(o(p) for o in options)

    def sequence(self):
        items = []
        while (token := self.peek()) is not None and token not in (("op", "|"), ("op", ")"), ("op", "]")):
            item = self.item()
            if item is None:
                return None
            items.append(item)
        return lambda p: all(i(p) for i in items)

    def item(self):
        atom = self.atom()
        if atom is None:
            return None
        while (token := self.peek()) is not None and (token[0] == "repeat" or token[1] in ("?", "*", "+")):
            self.at += 1
            if token[1] in ("?", "*") or _may_repeat_none(token[1]):
                atom = lambda p: True  # noqa: E731 (zero times is a finite string)
        return atom

    def atom(self):
        token = self.peek()
        if token is None:
            return None
        self.at += 1
        kind, value = token
        if kind in ("string", "regex"):
            return lambda p: True
        if kind == "name":
            return (
                (lambda p: value in p)
                if value[0].islower() or value[0] == "_" and value[1:2].islower()
                else (lambda p: True)
            )
        if value in ("(", "["):
            inner = self.alternatives()
            closing = ")" if value == "(" else "]"
            if inner is None or self.peek() != ("op", closing):
                return None
            self.at += 1
            return inner if value == "(" else (lambda p: True)
        return None


def _may_repeat_none(repeat: str) -> bool:
    """{m,n} or ~m..n with m = 0 (or m left out)."""
    low = re.findall(r"\d+", repeat.split(",")[0] if repeat.startswith("{") else repeat.split("..")[0])
    return not low or int(low[0]) == 0
