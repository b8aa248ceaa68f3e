"""A chat's history with tools: each message checked as OpenAI checks it, then shaped for the chat template.

`checked_messages` turns the request's messages into one neutral form:

    {"role": "system" | "developer" | "user" | "assistant", "content": str}
    {"role": "assistant", "content": str ("" when null), "tool_calls": [{"id", "type": "function",
     "function": {"name", "arguments"}}]}           arguments: the JSON object, as Hugging Face templates read it
    {"role": "tool", "content": str, "tool_call_id": str | None, "name": str}
                                                    (the legacy "function" role becomes a tool result by name)

A tool result's `tool_call_id` must be the id of a call in an earlier assistant message (the ids the
server returned are taken back as they were sent), else a 400 naming it.

`for_template(messages, template)` passes that form to a template that renders tool calls and tool
results (its source reads `tool_calls` and names the "tool" role, as Qwen2.5's and Llama 3.1's do);
any other template gets the generic rendering: an assistant's calls appended to its content as the
JSON array the server's own tool-call format writes ([{"name", "arguments"}]), and each run of tool
results as one user turn, a block per result: "Tool result of NAME (call N):" (N: the call's place in the
assistant message, left out for a lone call) then the result, and last "Answer the question with this
result." (these results, for several).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictStr

from .errors import APIError


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends and returns it


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "index", echoed from a stream's deltas
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields: refused unless empty (see schemas._refuse_undeclared)
    role: StrictStr  # one of ROLES (checked by checked_messages, with a message that says why)
    content: StrictStr | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    function_call: FunctionCall | None = None  # assistant, legacy: one call without an id
    tool_call_id: StrictStr | None = None  # tool
    name: StrictStr | None = None  # function (legacy tool result); tool (optional)


ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def checked_messages(messages: list[ChatMessage]) -> list[dict]:
    """The messages in the neutral form above (a 400 naming the field for any OpenAI would refuse)."""
    calls: dict[str, str] = {}  # call id -> function name, of the assistant messages so far
    checked = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if message.role not in ROLES:
            raise APIError(
                400,
                f"{where}.role: {message.role!r} is not a role; the roles are {', '.join(ROLES)}",
                f"{where}.role",
                "invalid_value",
            )
        if message.name is not None and message.role not in ("tool", "function"):
            raise APIError(
                400,
                f"{where}.name: not supported (the chat template gets only role and content); leave it out",
                f"{where}.name",
                "unsupported_value",
            )
        if message.role == "assistant":
            checked.append(_assistant(message, where, calls))
        elif message.role in ("tool", "function"):
            checked.append(_tool_result(message, where, calls))
        else:
            checked.append({"role": message.role, "content": _text(message, where)})
    return checked


def _assistant(message: ChatMessage, where: str, calls: dict[str, str]) -> dict:
    given = list(message.tool_calls or [])
    if message.function_call is not None:
        given.append(ToolCall(id=f"legacy_{len(calls)}", function=message.function_call))
    if not given:
        return {"role": "assistant", "content": _text(message, where)}
    shaped = []
    for call in given:
        calls[call.id] = call.function.name
        shaped.append(
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
        )
    content = "" if message.content is None else _text(message, where)
    return {"role": "assistant", "content": content, "tool_calls": shaped}


def _tool_result(message: ChatMessage, where: str, calls: dict[str, str]) -> dict:
    content = _text(message, where)
    if message.role == "function":
        if message.name is None:
            raise APIError(
                400, f"{where}.name: a function message needs the function's name", f"{where}.name", "missing"
            )
        return {"role": "tool", "content": content, "tool_call_id": None, "name": message.name}
    if message.tool_call_id is None:
        raise APIError(
            400,
            f"{where}.tool_call_id: a tool message needs the id of the call it answers",
            f"{where}.tool_call_id",
            "missing",
        )
    if message.tool_call_id not in calls:
        raise APIError(
            400,
            f"{where}.tool_call_id: {message.tool_call_id[:64]!r} is not the id of a call in an earlier "
            "assistant message's tool_calls; send the assistant message with its tool_calls first",
            f"{where}.tool_call_id",
            "invalid_value",
        )
    return {
        "role": "tool",
        "content": content,
        "tool_call_id": message.tool_call_id,
        "name": message.name or calls[message.tool_call_id],
    }


def _arguments(text: str) -> Any:
    """The arguments as Hugging Face templates read them: the JSON object (a text that is none stays text)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _text(message: ChatMessage, where: str) -> str:
    """The content as one string: a string, or its text parts joined."""
    if "content" not in message.model_fields_set:
        raise APIError(400, f"{where}.content: this field is required", f"{where}.content", "missing")
    if message.content is None:
        raise APIError(
            400,
            f"{where}.content: a message's content must be a string or a non-empty list of text parts "
            "(null only in an assistant message with tool_calls)",
            f"{where}.content",
            "invalid_value",
        )
    if isinstance(message.content, str):
        return message.content
    if not message.content:
        raise APIError(
            400,
            f"{where}.content: an empty list of parts; send a string or at least one part like "
            '{"type": "text", "text": "Hi"}',
            f"{where}.content",
            "invalid_value",
        )
    texts = []
    for i, part in enumerate(message.content):
        if part.type != "text":
            raise APIError(
                400,
                f"{where}.content.{i}: only text parts are supported, not {part.type!r} parts",
                f"{where}.content.{i}.type",
                "unsupported_value",
            )
        if part.text is None:
            raise APIError(
                400,
                f'{where}.content.{i}: a text part needs its text, like {{"type": "text", "text": "Hi"}}',
                f"{where}.content.{i}.text",
                "missing",
            )
        texts.append(part.text)
    return "".join(texts)


ANSWER_ONE = "Answer the question with this result."
ANSWER_SEVERAL = "Answer the question with these results."
_TOOL_ROLE = re.compile(r"""['"]tool['"]""")


def renders_tool_history(template: str | None) -> bool:
    """The template renders assistant tool_calls and "tool" messages itself (as Hugging Face templates that know
    tools)."""
    return bool(template) and "tool_calls" in template and _TOOL_ROLE.search(template) is not None


def for_template(messages: list[dict], template: str | None) -> list[dict]:
    """`messages` (the neutral form) as the template gets them: as they are where it renders tool history,
    else in the generic rendering (module docstring); plain messages are passed as they are either way."""
    if renders_tool_history(template) or not any("tool_calls" in m or m["role"] == "tool" for m in messages):
        return messages
    shaped: list[dict] = []
    called: list[str] = []  # the ids of the last assistant message's calls
    for message in messages:
        if message["role"] == "tool":
            block = generic_result(message, called)
            if shaped and shaped[-1].get("tool_results"):
                last = shaped[-1]
                shaped[-1] = {
                    **last,
                    "content": last["content"] + "\n\n" + block,
                    "tool_results": last["tool_results"] + 1,
                }
            else:
                shaped.append({"role": "user", "content": block, "tool_results": 1})
        elif "tool_calls" in message:
            called = [call.get("id") for call in message["tool_calls"]]
            shaped.append({"role": "assistant", "content": generic_calls(message)})
        else:
            shaped.append(message)
    return [_closed(m) if m.get("tool_results") else m for m in shaped]


def _closed(turn: dict) -> dict:
    """A run of tool results as one user turn, ending with a request to answer: without it SmolLM2-135M
    repeats the call it just made, turn after turn, until an agent's turn limit (benchmarks/agent_frameworks.py)."""
    several = turn["tool_results"] > 1
    return {"role": "user", "content": turn["content"] + "\n\n" + (ANSWER_SEVERAL if several else ANSWER_ONE)}


def generic_calls(message: dict) -> str:
    """An assistant message's text, then its calls as the JSON array tool_choice "required" makes the model write."""
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    written = json.dumps(calls, ensure_ascii=False)
    return f"{message['content']}\n{written}" if message["content"] else written


def generic_result(message: dict, called: list[str]) -> str:
    """One result's block. The call is named by its place among the assistant's calls, and only when there
    were several: its id is random, and written into the prompt it changed what SmolLM2 answered (an answer
    one run, the same call again the next, for the same conversation)."""
    place = called.index(message["tool_call_id"]) + 1 if message["tool_call_id"] in called else None
    call = f" (call {place})" if place is not None and len(called) > 1 else ""
    return f"Tool result of {message['name']}{call}:\n{message['content']}"
