"""The request fields that constrain the output, parsed into one runtime Constraint (or none).

    response_format      {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}
    structured_outputs   vLLM's: exactly one of {"json": schema, "regex": str, "choice": [str], "grammar": str},
                         or {"json_object": true}
    tools + tool_choice  chat: "required" (a JSON array of calls to the given functions, each's arguments
                         following its `parameters`) or {"type": "function", "function": {"name": N}} (N's
                         arguments object); "none" constrains nothing; "auto" (or none given) constrains
                         nothing either: where the chat template renders tools (the server checks, else a
                         400), calls in the reply, between the tags the template announces, become tool_calls

Every schema, regex and grammar is compiled when parsed, so a bad one is a 400 naming its field
before any work; so is one that no finite output matches (server/finite.py). At most one of the
three may constrain a request.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from jacobi_rt.runtime import TOOL_CALL_TAGS, Constraint, InputError, MissingDependencyError

from .call_schema import call_schemas, closed
from .errors import APIError
from .finite import no_finite_output
from .tool_calls import ToolCalls

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function and schema names


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its older `guided_*` fields, one by one, are refused with a pointer here)."""

    model_config = ConfigDict(extra="allow")  # structural_tag, whitespace_pattern ...: refused by name
    json_: dict[str, Any] | StrictStr | None = Field(None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None
    disable_fallback: StrictBool | None = None  # there is one batcher: nothing to fall back to


def constraint_of(
    response_format: dict | None,
    structured: StructuredOutputs | None,
    tools: list | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
) -> tuple[Constraint | None, ToolCalls | None]:
    """The request's constraint and, for tool calls, how the reply presents the output (tool_choice "auto"
    constrains nothing, so another field may constrain its reply)."""
    calls = _tools(tools, tool_choice, parallel_tool_calls)
    found = [
        (name, parsed)
        for name, parsed in (
            ("response_format", _response_format(response_format)),
            ("structured_outputs", _structured(structured)),
            ("tool_choice", calls),
        )
        if parsed[0] is not None
    ]
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise APIError(400, f"{names} both constrain the output; send one of them", found[1][0], "invalid_value")
    return (found[0][1][0] if found else None), calls[1]


def _response_format(value: dict | None) -> tuple[Constraint | None, None]:
    if value is None:
        return None, None
    kind = value.get("type")
    if kind == "text":
        _only(value, {"type"}, "response_format")
        return None, None
    if kind == "json_object":
        _only(value, {"type"}, "response_format")
        return made(Constraint.json_object, "response_format"), None
    if kind == "json_schema":
        _only(value, {"type", "json_schema"}, "response_format")
        spec = value.get("json_schema")
        where = "response_format.json_schema"
        if not isinstance(spec, dict):
            raise APIError(
                400, f'{where}: expected an object like {{"name": "answer", "schema": {{...}}}}', where, "invalid_value"
            )
        _only(spec, {"name", "schema", "strict", "description"}, where)
        name = spec.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise APIError(
                400,
                f"{where}.name: a name of 1-64 letters, digits, _ or - is required",
                f"{where}.name",
                "invalid_value",
            )
        if "strict" in spec and not isinstance(spec["strict"], (bool, type(None))):
            raise APIError(400, f"{where}.strict must be true or false", f"{where}.strict", "invalid_value")
        if "schema" not in spec:
            raise APIError(400, f"{where}.schema: this field is required", f"{where}.schema", "missing")
        return made(Constraint.json_schema, f"{where}.schema", spec["schema"]), None
    raise APIError(
        400,
        f'response_format.type must be "text", "json_object" or "json_schema", not {kind!r}',
        "response_format.type",
        "invalid_value",
    )


def _structured(value: StructuredOutputs | None) -> tuple[Constraint | None, None]:
    if value is None:
        return None, None
    for name in value.model_extra or {}:
        raise APIError(
            400,
            f"structured_outputs.{name} is not supported; use json, regex, choice, grammar or json_object",
            f"structured_outputs.{name}",
            "unsupported_value",
        )
    given = {
        name: v
        for name, v in (
            ("json", value.json_),
            ("regex", value.regex),
            ("choice", value.choice),
            ("grammar", value.grammar),
        )
        if v is not None
    }
    if value.json_object:
        given["json_object"] = True
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise APIError(
            400,
            f"structured_outputs takes exactly one of json, regex, choice, grammar or json_object, not {what}",
            "structured_outputs",
            "invalid_value",
        )
    ((name, v),) = given.items()
    where = f"structured_outputs.{name}"
    if name == "json":
        if isinstance(v, str):
            v = _json_text(v, where)
        return made(Constraint.json_schema, where, v), None
    if name == "json_object":
        return made(Constraint.json_object, where), None
    make = {"regex": Constraint.regex, "choice": Constraint.choice, "grammar": Constraint.lark}[name]
    return made(make, where, v), None


def _tools(tools: list | None, choice: Any, parallel: bool | None) -> tuple[Constraint | None, ToolCalls | None]:
    if not tools:
        if choice not in (None, "none", "auto"):
            raise APIError(
                400, "tool_choice names a tool, but the request has no tools", "tool_choice", "invalid_value"
            )
        return None, None
    functions = _functions(tools)
    if choice == "none":
        return None, None
    if choice in (None, "auto"):  # the model decides; tool_protocol.resolved picks the protocol for the model
        return None, ToolCalls(None, TOOL_CALL_TAGS, tuple(functions), parallel=parallel is not False)
    if choice == "required":
        calls, defs = call_schemas(functions)
        schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if defs:
            schema["$defs"] = defs
        if parallel is False:
            schema["maxItems"] = 1
        return made(Constraint.json_schema, "tools", schema), ToolCalls(
            None, names=tuple(functions), parallel=parallel is not False
        )
    name = (
        choice.get("function", {}).get("name")
        if isinstance(choice, dict) and choice.get("type") == "function"
        else None
    )
    if not isinstance(name, str):
        raise APIError(
            400,
            'tool_choice must be "none", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
            "invalid_value",
        )
    if name not in functions:
        raise APIError(
            400,
            f"tool_choice names {name!r}, which is not among the tools",
            "tool_choice.function.name",
            "invalid_value",
        )
    index = list(functions).index(name)
    return made(Constraint.json_schema, f"tools.{index}.function.parameters", functions[name]), ToolCalls(name)


def _functions(tools: list) -> dict[str, dict]:
    """name -> parameters schema, each tool checked as OpenAI checks it."""
    return {name: closed(spec["parameters"]) for name, spec in function_specs(tools).items()}


def function_specs(tools: list) -> dict[str, dict]:
    """name -> {"name", "description" (when given), "parameters"}, each tool checked as OpenAI checks it."""
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise APIError(
                400,
                f'{where}: a tool must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}',
                where,
                "invalid_value",
            )
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise APIError(
                400,
                f"{where}.function.name: a name of 1-64 letters, digits, _ or - is required",
                f"{where}.function.name",
                "invalid_value",
            )
        if name in functions:
            raise APIError(
                400, f"{where}.function.name: {name!r} is given twice", f"{where}.function.name", "invalid_value"
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise APIError(
                400,
                f"{where}.function.parameters must be a JSON schema object",
                f"{where}.function.parameters",
                "invalid_value",
            )
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise APIError(
                400, f"{where}.function.description must be a string", f"{where}.function.description", "invalid_value"
            )
        functions[name] = {
            "name": name,
            **({"description": description} if description else {}),
            "parameters": parameters,
        }
    return functions


def _json_text(text: str, where: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        raise APIError(
            400, f"{where}: a schema given as a string must be JSON ({exc})", where, "invalid_value"
        ) from None


def _only(value: dict, allowed: set[str], where: str) -> None:
    for name in value:
        if name not in allowed:
            raise APIError(
                400, f"{where}.{name} is not supported; leave it out", f"{where}.{name}", "unsupported_value"
            )


def made(make, where: str, *args) -> Constraint:
    """The constraint, or a 400 naming the field (its message already begins with the field's name)."""
    try:
        constraint = make(*args, where=where)
    except MissingDependencyError as exc:
        raise APIError(
            501, f"{where}: this server cannot constrain output ({exc})", where, "unsupported_value"
        ) from None
    except InputError as exc:
        raise APIError(400, str(exc), where, "invalid_value") from None
    why = no_finite_output(constraint.grammar)
    if why is not None:  # llguidance takes it, then generation would run until its parser gives up
        raise APIError(400, f"{where}: {why}; no output could ever finish", where, "invalid_value")
    return constraint
