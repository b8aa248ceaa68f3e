"""benchmarks/extraction.py's same-text pairs: a schema read off a free answer accepts that answer as written."""

from __future__ import annotations

import json

import pytest

from benchmarks.extraction import answer_schema, extraction_set, form_prompt


def test_an_answers_schema_follows_its_keys_types_and_whitespace():
    jsonschema = pytest.importorskip("jsonschema", reason="the schema check needs jsonschema: pip install jsonschema")
    compact = '{"name": "Ada", "year": 1815, "tags": ["a", "b"], "score": 4.5, "ok": true, "city": null}'
    schema = answer_schema(compact)
    jsonschema.validate(json.loads(compact), schema)
    assert schema["required"] == ["name", "year", "tags", "score", "ok", "city"]  # in the answer's order
    assert schema["properties"]["year"] == {"type": "integer"} and schema["properties"]["tags"]["items"] == {
        "type": "string"
    }
    assert "x-guidance" not in schema  # the one-line form: the constraint's default separators
    assert answer_schema('{\n  "name": "Ada"\n}')["x-guidance"]["whitespace_flexible"] is True
    with pytest.raises(jsonschema.ValidationError):  # a wrong type is refused: the schema constrains the values
        jsonschema.validate({"name": "Ada", "year": "1815", "tags": [], "score": 1, "ok": False, "city": None}, schema)


def test_answers_no_schema_can_ask_for_have_none():
    assert answer_schema('{"a": 1, "a": 2}') is None  # a repeated key
    assert answer_schema('```json\n{"a": 1}\n```') is None and answer_schema("[1, 2]") is None


def test_a_form_prompt_names_the_items_fields():
    item = extraction_set()[0]
    assert form_prompt(item).startswith(item.prompt) and all(
        f'"{key}": null' in form_prompt(item) for key in item.schema["properties"]
    )
