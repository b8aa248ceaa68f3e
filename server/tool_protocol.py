"""tool_choice "auto" on every model: the chat template's own tool protocol where it has one, else the generic one.

template  the template renders the tools (it reads `tools`) and announces calls as JSON between
          <tool_call> and </tool_call> (Qwen2.5's, Hermes'): the tools go into the prompt through it,
          the reply is the model's own text, its tagged calls become tool_calls (ToolCalls.tags)
generic   any other template (SmolLM2's): the tools are described in a system message (`described`),
          and the output is constrained by the grammar, in one of two forms (`generic_form`):
          json    a turn that answers the user: one JSON object, either
                      {"tool_call": {"name": NAME, "arguments": {...}}}   a call of an offered function,
                                                                          its arguments following its
                                                                          `parameters` (one call a turn)
                      {"response": "..."}                                 a plain answer
                  as llama.cpp's generic format has it. A free start let SmolLM2-135M write a Python code
                  block instead of a call on every framework's first turn; made to choose a key first, it calls.
          text    the turn right after tool results: one of
                      {"name": NAME, "arguments": {...}}          a call, as above
                      [{"name": ..., "arguments": ...}, ...]      several (not with parallel_tool_calls false)
                      a plain answer                              any text that starts with neither "{" nor
                                                                  "[" nor whitespace
                  Forced into JSON there, SmolLM2-135M made the same call again instead of answering with
                  its result (benchmarks: agent_frameworks, docs/bench/2026-12-04-tool-auto-json.md).
          then read into tool_calls or content (ToolCalls.generic). Being a constraint, it is exact under
          every strategy, and it cannot be combined with response_format or structured_outputs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Literal

from jacobi_rt.runtime import JSON_FORMAT, Constraint, Tokenizer

from .call_schema import call_schemas, closed
from .errors import APIError
from .schemas import GenerationCall
from .structured import function_specs, made
from .tool_calls import GenericForm, ToolCalls

Protocol = Literal["template", "generic"]

INTRO = "You can call these functions:"
CALL_FORMAT = (
    'To call a function, reply with only a JSON object {"name": <function name>, "arguments": <its arguments>}'
)
ANSWER = ". Otherwise reply to the user in plain text."
SEVERAL = " (several calls: a JSON array of such objects)"
JSON_REPLY = (
    'Reply with only a JSON object: {"tool_call": {"name": <function name>, "arguments": <its arguments>}} '
    'to call a function, or {"response": <your answer>} to answer the user.'
)


def protocol(tokenizer: Tokenizer) -> Protocol:
    """Which protocol tool_choice "auto" gets on this model (GET /v1/models says it as jacobi.tools)."""
    return "template" if tokenizer.tool_call_tags is not None else "generic"


def resolve_tools(call: GenerationCall, tokenizer: Tokenizer) -> None:
    """Make `call` (in place, so whatever holds it, a Responses turn too, answers by it) as this model serves
    it: a chat with tool_choice "auto" on a template without the template protocol gets the generic one (the
    system message, the grammar, the reader); a named function on a template that renders no tools gets the
    tools listed in the system message (`listed`), since its output, the bare arguments, names nothing; any
    other call stays as it is."""
    if call.tools is None:
        return
    if call.tools.tags is None:
        if call.tools.name is not None and call.messages is not None and call.tool_specs and not tokenizer.takes_tools:
            call.messages = listed(call.messages, list(function_specs(call.tool_specs).values()))
        return
    if protocol(tokenizer) == "template":
        return
    if call.constraint is not None:
        raise APIError(
            400,
            'tool_choice "auto" on this model constrains the output (the generic tool protocol), as '
            "response_format or structured_outputs does: send one of them",
            "tool_choice",
            "invalid_value",
        )
    specs = function_specs(call.tool_specs)
    parallel, form = call.tools.parallel, generic_form(call.messages)
    parameters = {name: spec["parameters"] for name, spec in specs.items()}
    constraint = made(Constraint.lark, "tools", grammar(parameters, parallel, form))
    call.messages = described(call.messages, list(specs.values()), parallel, form)
    call.params = replace(call.params, constraint=constraint)
    call.tools = ToolCalls(None, names=tuple(specs), parallel=parallel, generic=form)


def generic_form(messages: list[dict]) -> GenericForm:
    """ "text" for the turn right after tool results, "json" for any other (the module docstring says why)."""
    return "text" if messages and messages[-1]["role"] == "tool" else "json"


def described(messages: list[dict], functions: list[dict], parallel: bool, form: GenericForm) -> list[dict]:
    """`messages` with the tools described at the end of the first system message (or in a new one first)."""
    protocol = JSON_REPLY if form == "json" else CALL_FORMAT + (SEVERAL if parallel else "") + ANSWER
    return _appended(messages, _lines(functions) + "\n\n" + protocol)


def listed(messages: list[dict], functions: list[dict]) -> list[dict]:
    """`messages` with the tools listed as `described` lists them, without the protocol's words: under a named
    tool_choice the grammar alone says what to write. SmolLM2-135M without the list wrote {"a": 10, "b": 7}
    for "Call multiply with a=6 and b=7" (benchmarks/agent_frameworks.py). Not for "required": its output names
    the function, and with the list SmolLM2 wrote the same call again and again until max_tokens."""
    return _appended(messages, _lines(functions))


def _lines(functions: list[dict]) -> str:
    return "\n".join([INTRO] + [json.dumps(function, ensure_ascii=False) for function in functions])


def _appended(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{text}" if first["content"] else text}] + messages[1:]
    return [{"role": "system", "content": text}] + messages


def grammar(functions: dict[str, dict], parallel: bool, form: GenericForm = "text") -> str:
    """The Lark grammar (llguidance's dialect) of the generic protocol's output in `form`."""
    items, defs = call_schemas({name: closed(parameters) for name, parameters in functions.items()})
    one = items[0] if len(items) == 1 else {"anyOf": items}
    if form == "json":
        schema = {"anyOf": [_object("tool_call", one), _object("response", {"type": "string"})]}
    else:
        schema = {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]} if parallel else dict(one)
    if defs:
        schema["$defs"] = defs
    schema["x-guidance"] = JSON_FORMAT  # the separators every other constrained JSON output has
    if form == "json":
        return f"start: reply\nreply: %json {json.dumps(schema)}\n"
    return "\n".join(["start: call | answer", f"call: %json {json.dumps(schema)}", r"answer: /[^\[{\s][\s\S]*/", ""])


def _object(key: str, value: dict) -> dict:
    return {"type": "object", "properties": {key: value}, "required": [key], "additionalProperties": False}
