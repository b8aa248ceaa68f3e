"""server/call_schema.py: a function's parameters with internal $refs still resolve once wrapped in a call object."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.runtime.constraints import Constraint  # noqa: E402
from jacobi_rt.server.call_schema import call_schemas  # noqa: E402
from jacobi_rt.server.tool_protocol import grammar  # noqa: E402

# as pydantic writes a model with a nested one (pydantic-ai's output tools, openai-agents' strict tools)
NESTED = {
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "type": "object",
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
    "required": ["name", "address"],
}
TREE = {
    "type": "object",
    "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
}  # recursive, with a way out
FLAT = {"type": "object", "properties": {"a": {"type": "integer", "default": {"$ref": "#/not/a/schema"}}}}


def test_a_schema_with_local_refs_moves_into_defs_with_its_pointers_prefixed():
    items, defs = call_schemas({"save": NESTED, "grow": TREE, "flat": FLAT})
    assert [item["properties"]["arguments"] for item in items] == [
        {"$ref": "#/$defs/fn_0"},
        {"$ref": "#/$defs/fn_1"},
        FLAT,
    ]
    assert defs["fn_0"]["properties"]["address"] == {"$ref": "#/$defs/fn_0/$defs/Address"}
    assert defs["fn_1"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/fn_1"}
    assert "fn_2" not in defs  # a "$ref" inside `default` is data: the schema stays inline, untouched


@pytest.mark.parametrize("parameters", [NESTED, TREE], ids=["defs", "root-ref"])
def test_required_and_the_generic_protocol_compile_such_parameters(parameters):
    """Both failed with "Pointer '/$defs/Address' does not exist" before the parameters were moved."""
    items, defs = call_schemas({"f": parameters})
    Constraint.json_schema({"type": "array", "minItems": 1, "items": items[0], "$defs": defs}).grammar
    Constraint.lark(grammar({"f": parameters}, True)).grammar


def test_the_generic_grammar_keeps_parameters_without_refs_inline():
    """Schemas without $refs compile to the same grammar as before (the outputs tested elsewhere stay)."""
    from jacobi_rt.server.call_schema import closed

    text = grammar({"f": FLAT}, False)
    assert json.dumps(closed(FLAT)) in text and "$defs" not in text


def test_closed_admits_only_the_listed_properties_where_the_schema_says_nothing_of_others():
    from jacobi_rt.server.call_schema import closed

    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "properties": {"type": "object", "properties": {}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
        },
    }
    out = closed(person)
    assert out["additionalProperties"] is False and out["properties"]["tags"]["items"]["additionalProperties"] is False
    assert out["properties"]["properties"] == {"type": "object", "properties": {}, "additionalProperties": False}
    assert "additionalProperties" not in out["properties"]  # a property named "properties" is no keyword
    left = [
        {"type": "object", "properties": {"a": {}}, "additionalProperties": True},  # says so itself
        {"type": "object", "properties": {"a": {}}, "allOf": [{"type": "object", "properties": {"b": {}}}]},
        {"type": "object", "properties": {"a": {}}, "$ref": "#/$defs/B"},
    ]
    assert closed(left) == left
