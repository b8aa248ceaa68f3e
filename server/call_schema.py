"""The JSON schema of a call object {"name": N, "arguments": {...}} of the offered functions.

tool_choice "required" (an array of calls) and the generic "auto" protocol (a call, or an array) embed each
function's `parameters` under `arguments`. A parameters schema with internal `$ref`s (`#/$defs/Address`, as
pydantic writes a nested model; `#` for a recursive one) would then point into the wrapper instead of
itself, so such a schema is moved whole into the wrapper's `$defs` and its pointers are prefixed with its
new place: `#/$defs/Address` becomes `#/$defs/fn_0/$defs/Address`. A schema without one stays inline.

`closed(parameters)`: an object schema that lists `properties` and says nothing of other ones admits only
those. JSON Schema lets such an object have any other property, and so would the grammar: LangChain's
tools say nothing (`with_structured_output(method="function_calling")`), and SmolLM2-135M then writes
made-up properties until max_tokens cuts the call, which the framework cannot parse; llama-server's call
of the same tool ends after the listed properties. A node combined with allOf, anyOf, oneOf, $ref or
if/then is left open (closing it could refuse the properties its other parts allow).
"""

from __future__ import annotations

from typing import Any

# keywords whose values are data, not schemas: a "$ref" key inside them is no reference
_DATA = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
_OPEN_WITH = frozenset(
    {
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "if",
        "then",
        "else",
        "dependentSchemas",
    }
)


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on each object node that lists properties and says nothing
    of others (the nodes inside allOf stay as they are: their intersection is the point)."""
    if isinstance(schema, list):
        return [closed(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed_keyword(key, value) for key, value in schema.items()}
    if isinstance(schema.get("properties"), dict) and not _OPEN_WITH & schema.keys():
        out["additionalProperties"] = False
    return out


def _closed_keyword(key: str, value: Any) -> Any:
    if key in _DATA or key == "allOf":
        return value
    if key in _SCHEMA_MAPS and isinstance(value, dict):  # name -> schema: the names are no keywords
        return {name: closed(sub) for name, sub in value.items()}
    return closed(value)


def call_schemas(functions: dict[str, dict]) -> tuple[list[dict], dict[str, Any]]:
    """(one call object schema per function, the `$defs` the wrapping schema's root must carry)."""
    items, defs = [], {}
    for i, (name, parameters) in enumerate(functions.items()):
        if _has_local_ref(parameters):
            place = f"fn_{i}"
            defs[place] = _prefixed(parameters, f"#/$defs/{place}")
            parameters = {"$ref": f"#/$defs/{place}"}
        items.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "arguments"],
                "properties": {"name": {"const": name}, "arguments": parameters},
            }
        )
    return items, defs


def _has_local_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            return True
        return any(_has_local_ref(value) for key, value in schema.items() if key not in _DATA)
    if isinstance(schema, list):
        return any(_has_local_ref(value) for value in schema)
    return False


def _prefixed(schema: Any, place: str) -> Any:
    """`schema` with every local `$ref` ("#", "#/...") pointing under `place` instead of the root."""
    if isinstance(schema, dict):
        out = {key: value if key in _DATA else _prefixed(value, place) for key, value in schema.items()}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = place + ref[1:]
        return out
    if isinstance(schema, list):
        return [_prefixed(value, place) for value in schema]
    return schema
