"""The structured-output benchmark set: extraction prompts, each with its own JSON schema (tools/data/extraction.jsonl).

Each line: {"id", "prompt" (a user message), "chat": true, "schema" (4-10 fields: nested objects,
arrays, enums, numbers, strings), "example" (a valid answer, for tests and mask-cost runs)}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from jacobi_rt.runtime.errors import InputError


@dataclass(frozen=True)
class ExtractionItem:
    id: str
    prompt: str
    schema: dict
    example: dict
    chat: bool = True


def extraction_set(path: str | Path | None = None) -> list[ExtractionItem]:
    """The items of a JSONL file like tools/data/extraction.jsonl (default: the bundled one)."""
    text = (files("jacobi_rt.tools").joinpath("data/extraction.jsonl").read_text(encoding="utf-8") if path is None
            else Path(path).read_text(encoding="utf-8"))
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            items.append(ExtractionItem(str(row["id"]), str(row["prompt"]), dict(row["schema"]), dict(row.get("example") or {}),
                                        bool(row.get("chat", True))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path or 'extraction.jsonl'} line {number}: expected a JSON object with \"id\", \"prompt\" "
                             f"and \"schema\" ({exc})") from exc
    return items


def follows_schema(text: str, schema: dict) -> bool:
    """Whether `text` parses as JSON and validates against `schema` (needs jsonschema: pip install jsonschema)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False
