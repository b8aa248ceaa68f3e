"""The structured-output benchmark set: extraction prompts, each with its own JSON schema
(benchmarks/data/extraction.jsonl).

Each line: {"id", "prompt" (a user message), "chat": true, "schema" (4-10 fields: nested objects,
arrays, enums, numbers, strings), "example" (a valid answer, for tests and mask-cost runs)}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jacobi_rt.runtime.errors import InputError

DEFAULT_SET = Path(__file__).parent / "data" / "extraction.jsonl"


@dataclass(frozen=True)
class ExtractionItem:
    id: str
    prompt: str
    schema: dict
    example: dict
    chat: bool = True


def extraction_set(path: str | Path | None = None) -> list[ExtractionItem]:
    """The items of a JSONL file like benchmarks/data/extraction.jsonl (default: the bundled one)."""
    text = Path(path or DEFAULT_SET).read_text(encoding="utf-8")
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append(
                ExtractionItem(
                    str(row["id"]),
                    str(row["prompt"]),
                    dict(row["schema"]),
                    dict(row.get("example") or {}),
                    bool(row.get("chat", True)),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f'{path or "extraction.jsonl"} line {number}: expected a JSON object with "id", "prompt" '
                f'and "schema" ({exc})'
            ) from exc
    return items


def follows_schema(text: str, schema: dict) -> bool:
    """Whether `text` parses as JSON and validates against `schema` (needs jsonschema: pip install jsonschema)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def form_prompt(item: ExtractionItem) -> str:
    """The item's prompt asking for its fields in a form (keys, null values), so a small model's free answer is
    often a JSON object: the source of a same-text pair (`answer_schema`)."""
    return f"{item.prompt} Use this form: {json.dumps({key: None for key in item.schema.get('properties', {})})}"


def answer_schema(text: str) -> dict | None:
    """A JSON schema that the JSON object `text` follows and that leaves its writer's picks alone: every key
    required in its order, each value's own type (an array's items when they share one), whitespace as
    written (the compact `JSON_FORMAT`, or flexible with bare separators); None when `text` is not one JSON
    object or repeats a key (a schema cannot ask for that)."""

    def unique(pairs: list) -> dict:
        if len({key for key, _ in pairs}) != len(pairs):
            raise ValueError("a repeated key")
        return dict(pairs)

    try:
        value = json.loads(text, object_pairs_hook=unique)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    schema = _schema_of(value)
    if json.dumps(value, ensure_ascii=False) != text:  # not the one-line form the constraint writes by default
        schema["x-guidance"] = {"whitespace_flexible": True, "item_separator": ",", "key_separator": ":"}
    return schema


def _schema_of(value) -> dict:
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {key: _schema_of(v) for key, v in value.items()},
            "required": list(value),
            "additionalProperties": False,
        }
    if isinstance(value, list):
        items = [_schema_of(v) for v in value]
        return (
            {"type": "array", "items": items[0]} if items and all(i == items[0] for i in items) else {"type": "array"}
        )
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    return {"type": kinds[type(value)]}
