"""The JSON schema of a call object {"name": N, "arguments": {...}} of the offered functions.

tool_choice "required" (an array of calls) and the generic "auto" protocol (a call, or an array) embed each
function's `parameters` under `arguments`. A parameters schema with internal `$ref`s (`#/$defs/Address`, as
pydantic writes a nested model; `#` for a recursive one) would then point into the wrapper instead of
itself, so such a schema is moved whole into the wrapper's `$defs` and its pointers are prefixed with its
new place: `#/$defs/Address` becomes `#/$defs/fn_0/$defs/Address`. A schema without one stays inline.
"""

from __future__ import annotations

from typing import Any

# keywords whose values are data, not schemas: a "$ref" key inside them is no reference
_DATA = frozenset({"const", "enum", "default", "examples"})


def call_schemas(functions: dict[str, dict]) -> tuple[list[dict], dict[str, Any]]:
    """(one call object schema per function, the `$defs` the wrapping schema's root must carry)."""
    items, defs = [], {}
    for i, (name, parameters) in enumerate(functions.items()):
        if _has_local_ref(parameters):
            place = f"fn_{i}"
            defs[place] = _prefixed(parameters, f"#/$defs/{place}")
            parameters = {"$ref": f"#/$defs/{place}"}
        items.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                      "properties": {"name": {"const": name}, "arguments": parameters}})
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
