"""OpenAI's Responses API (`POST /v1/responses`), served by the chat endpoint's own machinery.

`parse_response(payload, store, model)` checks a Responses body and translates it into a chat
request: `instructions` becomes the first (system) message, the stored conversation of
`previous_response_id` follows (its instructions are not carried over, as OpenAI does), then the
`input` items (messages with input_text/output_text parts; function_call items become an assistant
message's tool_calls, function_call_output items tool messages); flat function `tools`, `tool_choice`,
`text.format` and `max_output_tokens` become their chat fields, the sampling fields pass as they are.
`schemas.parse_chat` then checks the whole as a chat request, so every chat rule holds here too; its
errors are renamed to the Responses field they came from (messages.3 -> input.1, max_tokens ->
max_output_tokens, response_format -> text.format). What the Responses API has and jacobi-rt does not
serve (built-in tools, background, reasoning, include, truncation "auto", conversation, prompt
templates, non-text parts) is a 400 naming the field.

`Turn.response(chat)` turns the finished chat completion (`replies.Reply.whole`) into a Response object
(output items, status "incomplete" with `incomplete_details` when cut by max_output_tokens, usage) and
stores its conversation under its id unless `store: false` (`ResponseStore`, least recently used out
first). `ResponseEvents` writes the typed server-sent events of a streamed response.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from .errors import APIError
from .schemas import GenerationCall, _validate, parse_chat, refuse_extra

Number = StrictInt | StrictFloat

STORE_RESPONSES = 1024  # responses kept for previous_response_id
STORE_CHARS = 64 << 20  # and at most this much conversation (JSON characters) in all


class ResponsesRequest(BaseModel):
    """The Responses fields jacobi-rt reads (server/openapi.py documents them, narrowed to what is served)."""

    model_config = ConfigDict(extra="allow")  # undeclared fields: refused by name unless in IGNORED
    model: StrictStr | None = None
    input: StrictStr | list[dict[str, Any]] | None = None
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number | None = None
    top_p: Number | None = None
    stream: StrictBool = False
    store: StrictBool = True
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    # the chat endpoint's other sampling fields and jacobi-rt's knobs, passed on as they are
    seed: StrictInt | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    frequency_penalty: Number | None = None
    presence_penalty: Number | None = None
    stop: StrictStr | list[StrictStr] | None = None
    jacobi: dict[str, Any] | None = None
    # Responses fields served only at their default (anything else changes the output: NOT_SERVED)
    background: StrictBool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[StrictStr] | None = None
    truncation: StrictStr | None = None
    top_logprobs: StrictInt | None = None
    max_tool_calls: StrictInt | None = None


# Declared fields served at these values only, and why not others.
NOT_SERVED = {
    "background": ((None, False), "background: true is not served: jacobi-rt answers within the request; leave it out"),
    "include": ((None, []), "include is not served (no logprobs, reasoning or tool outputs to add); leave it out"),
    "truncation": ((None, "disabled"), 'truncation: only "disabled" is served ("auto" would drop input items)'),
    "top_logprobs": ((None, 0), "top_logprobs is not served on /v1/responses; chat completions has logprobs"),
    "max_tool_calls": ((None,), "max_tool_calls is not served; parallel_tool_calls: false allows one call"),
}
# Undeclared fields accepted and ignored: they cannot change the output (stream_options: include_obfuscation).
IGNORED = frozenset(
    {
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "stream_options",
    }
)
UNDECLARED = {
    "conversation": "conversation is not served: send previous_response_id, or the whole conversation as input",
    "prompt": "prompt (a stored prompt template) is not served: send instructions and input",
    "context_management": "context_management (compacting the context) is not served; leave it out",
    "max_tokens": "max_tokens is chat's name; the Responses API's is max_output_tokens",
    "messages": "messages is chat's field; the Responses API takes input (a string or a list of items)",
    "response_format": "response_format is chat's field; the Responses API takes text.format",
}
INPUT_HINT = (
    'send a string or a list of items like [{"role": "user", "content": "Hi"}], '
    '{"type": "function_call", ...} or {"type": "function_call_output", "call_id": ..., "output": ...}'
)
BUILT_IN = (
    "jacobi-rt runs no built-in tools (web_search, file_search, code_interpreter, computer use, MCP, image generation)"
)
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")
ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
}


# -- the store ------------------------------------------------------------------------------------


@dataclass
class Stored:
    messages: list[dict]  # the conversation (chat-shaped, without instructions), its last reply included
    response: dict  # the Response object, for GET /v1/responses/{id}
    chars: int


class ResponseStore:
    """The conversations and Response objects of the last `max_responses` stored responses, at most `max_chars` JSON
    characters in all; the least recently used goes first."""

    def __init__(self, max_responses: int = STORE_RESPONSES, max_chars: int = STORE_CHARS):
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, response_id: str) -> list[dict] | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is None:
                return None
            self._items.move_to_end(response_id)
            return stored.messages

    def response(self, response_id: str) -> dict | None:
        """The stored Response object (GET /v1/responses/{id}), or None."""
        with self._lock:
            stored = self._items.get(response_id)
            return None if stored is None else stored.response

    def delete(self, response_id: str) -> bool:
        with self._lock:
            stored = self._items.pop(response_id, None)
            if stored is not None:
                self._chars -= stored.chars
            return stored is not None

    def put(self, response_id: str, messages: list[dict], response: dict | None = None) -> None:
        response = response or {}
        chars = len(json.dumps(messages, ensure_ascii=False)) + len(json.dumps(response, ensure_ascii=False))
        if chars > self.max_chars:
            return  # larger than the whole store: not kept
        with self._lock:
            if response_id in self._items:
                self._chars -= self._items.pop(response_id).chars
            self._items[response_id] = Stored(messages, response, chars)
            self._chars += chars
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                _, dropped = self._items.popitem(last=False)
                self._chars -= dropped.chars


# -- request -> chat ------------------------------------------------------------------------------


@dataclass
class Turn:
    """A checked Responses request: the chat call it runs as, and what its Response object echoes."""

    call: GenerationCall
    request: ResponsesRequest
    conversation: list[dict]  # chat-shaped history + this input, without instructions: what a next turn continues
    store: ResponseStore
    model: str
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])
    created_at: int = field(default_factory=lambda: int(time.time()))

    def snapshot(self, status: str = "in_progress") -> dict:
        """The Response object before its output (a stream's response.created and response.in_progress)."""
        r, sampling = self.request, self.call.params.sampling
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": [],
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": r.store,
            "temperature": sampling.temperature,
            "text": {"format": (r.text or {}).get("format") or {"type": "text"}},
            "tool_choice": r.tool_choice or "auto",
            "tools": r.tools or [],
            "top_logprobs": 0,
            "top_p": sampling.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": r.user,
            "metadata": r.metadata or {},
        }

    def response(self, chat: dict) -> dict:
        """The finished Response object of chat completion `chat`; it and its conversation stored unless
        store: false."""
        choice, usage = chat["choices"][0], chat["usage"]
        incomplete = choice["finish_reason"] == "length"
        status = "incomplete" if incomplete else "completed"
        output = self._output(choice["message"], status)
        response = {
            **self.snapshot(status),
            "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": usage["prompt_tokens_details"],
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["total_tokens"],
            },
            "jacobi": chat["jacobi"],
        }
        if self.request.store:
            self.store.put(self.id, self.conversation + [_as_chat(choice["message"])], response)
        return response

    def _output(self, message: dict, status: str) -> list[dict]:
        calls = message.get("tool_calls") or []
        items = []
        if message.get("content") or (message.get("content") is not None and not calls):
            items.append(
                {
                    "type": "message",
                    "id": self.message_id,
                    "status": status,
                    "role": "assistant",
                    "content": [_text_part(message["content"])],
                }
            )
        for call in calls:
            items.append(
                {
                    "type": "function_call",
                    "id": _item_id(call["id"]),
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                    "status": status,
                }
            )
        return items


def _as_chat(message: dict) -> dict:
    """A chat reply's message as a next turn sends it back (content "" rather than null without calls)."""
    if message.get("tool_calls"):
        return {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]}
    return {"role": "assistant", "content": message.get("content") or ""}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def parse_response(payload: Any, store: ResponseStore, model: str) -> Turn:
    """The request as a Turn (a 400 naming the Responses field for anything not served or not valid)."""
    try:
        request = _validate(ResponsesRequest, payload)
    except APIError as exc:
        if exc.param and exc.param.split(".")[0] == "input" and exc.code == "invalid_value":
            raise APIError(400, f"{exc.param}: {INPUT_HINT}", exc.param, exc.code) from None
        raise
    _refuse(request)
    history = _history(request, store)
    chat, conversation, names = _chat_body(request, history)
    try:
        call = parse_chat(chat, allow_constraints=True)
    except APIError as exc:
        raise renamed(exc, names) from None
    return Turn(call, request, conversation, store, model)


def _refuse(request: ResponsesRequest) -> None:
    refuse_extra(request.model_extra, IGNORED, UNDECLARED)
    for name, (allowed, why) in NOT_SERVED.items():
        if getattr(request, name) not in allowed:
            raise APIError(400, why, name, "unsupported_value")
    if request.reasoning and any(value is not None for value in request.reasoning.values()):
        raise APIError(
            400,
            "reasoning is not served: this model has no reasoning settings; leave it out",
            "reasoning",
            "unsupported_value",
        )
    if request.input is None and request.previous_response_id is None:
        raise APIError(400, "input: this field is required (a string or a list of items)", "input", "missing")


def _history(request: ResponsesRequest, store: ResponseStore) -> list[dict]:
    if request.previous_response_id is None:
        return []
    history = store.get(request.previous_response_id)
    if history is None:
        raise APIError(
            400,
            f"previous_response_id: no stored response has the id {request.previous_response_id[:80]!r} "
            f"(this server keeps the last {store.max_responses} responses made with store: true, in "
            "memory, until it restarts); send the whole conversation as input",
            "previous_response_id",
            "previous_response_not_found",
        )
    return history


def _chat_body(request: ResponsesRequest, history: list[dict]) -> tuple[dict, list[dict], dict[str, str]]:
    """The chat request body, the conversation to store after it, and chat field -> Responses field for errors."""
    names: dict[str, str] = {}  # messages.N -> its Responses field (the other renames: _RENAMES)
    messages: list[dict] = []
    if request.instructions is not None:
        names["messages.0"] = "instructions"
        messages.append({"role": "system", "content": request.instructions})
    for message in history:
        names[f"messages.{len(messages)}"] = "previous_response_id"
        messages.append(message)
    given = _input_messages(request.input, _call_ids(history))
    for message, where in given:
        names[f"messages.{len(messages)}"] = where
        messages.append(message)
    body = {name: value for name, value in request.model_dump(include=PASSED_ON).items() if value is not None}
    body.update(messages=messages, max_tokens=request.max_output_tokens)
    if request.tools is not None:
        body["tools"] = _tools(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.text is not None:
        body["response_format"] = _text_format(request.text)
    return body, history + [m for m, _ in given], names


PASSED_ON = {
    "model",
    "temperature",
    "top_p",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "jacobi",
    "stream",
    "parallel_tool_calls",
    "user",
}


def _call_ids(messages: list[dict]) -> set[str]:
    return {call["id"] for m in messages for call in m.get("tool_calls") or []}


def _input_messages(given: str | list[dict] | None, calls: set[str]) -> list[tuple[dict, str]]:
    """(chat message, the input field it came from) for each input item; consecutive function_call items (and the
    assistant message just before them) make one assistant message with tool_calls."""
    if given is None:
        return []
    if isinstance(given, str):
        return [({"role": "user", "content": given}, "input")]
    out: list[tuple[dict, str]] = []
    for index, item in enumerate(given):
        where = f"input.{index}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in ITEM_KEYS:
            raise APIError(
                400,
                f"{where}.type: {kind!r} items are not served; the items are messages, function_call and "
                "function_call_output",
                f"{where}.type",
                "unsupported_value",
            )
        for key in item:
            if key not in ITEM_KEYS[kind]:
                raise APIError(
                    400,
                    f"{where}.{key}: not supported in a {kind} item; leave it out",
                    f"{where}.{key}",
                    "unsupported_value",
                )
        if kind == "message":
            out.append((_message(item, where), where))
        elif kind == "function_call":
            call = _function_call(item, where)
            calls.add(call["id"])
            if out and out[-1][0]["role"] == "assistant":
                out[-1][0].setdefault("tool_calls", []).append(call)
            else:
                out.append(({"role": "assistant", "content": None, "tool_calls": [call]}, where))
        else:
            out.append((_function_output(item, where, calls), where))
    return out


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise APIError(
            400,
            f"{where}.role: {role!r} is not a message role; the roles are {', '.join(ROLES)}",
            f"{where}.role",
            "invalid_value",
        )
    return {"role": role, "content": _content(item.get("content"), f"{where}.content")}


def _content(content: Any, where: str) -> Any:
    """A string, or the text parts as chat's text parts (other parts: a 400 naming them)."""
    if not isinstance(content, list):
        return content  # a string, or something chat's checks refuse (renamed back to this field)
    parts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            raise APIError(
                400,
                f"{where}.{index}.type: {kind!r} parts are not served; this model reads text only "
                "(input_text, output_text)",
                f"{where}.{index}.type",
                "unsupported_value",
            )
        if part.get("annotations") or part.get("logprobs"):
            raise APIError(
                400,
                f"{where}.{index}: annotations and logprobs of a part are not read; leave them out",
                f"{where}.{index}",
                "unsupported_value",
            )
        parts.append({"type": "text", "text": part.get("text")})
    return parts


def _function_call(item: dict, where: str) -> dict:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise APIError(
                400, f"{where}.{key}: a function_call item needs its {key} (a string)", f"{where}.{key}", "missing"
            )
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _function_output(item: dict, where: str, calls: set[str]) -> dict:
    call_id = item.get("call_id")
    if call_id not in calls:
        shown = call_id[:64] if isinstance(call_id, str) else call_id
        raise APIError(
            400,
            f"{where}.call_id: {shown!r} is not the call_id of a function_call before it (in the input or "
            "the previous response)",
            f"{where}.call_id",
            "invalid_value",
        )
    return {"role": "tool", "tool_call_id": call_id, "content": _content(item.get("output"), f"{where}.output")}


def _tools(tools: list[dict]) -> list[dict]:
    """Responses' flat function tools as chat's {"type": "function", "function": {...}}."""
    shaped = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"{where}.type: {tool.get('type')!r} tools are not served: {BUILT_IN}; send function tools",
                f"{where}.type",
                "unsupported_value",
            )
        for key in tool:
            if key not in ("type", "name", "description", "parameters", "strict"):
                raise APIError(
                    400,
                    f"{where}.{key}: not supported in a function tool; leave it out",
                    f"{where}.{key}",
                    "unsupported_value",
                )
        shaped.append(
            {"type": "function", "function": {k: v for k, v in tool.items() if k != "type" and v is not None}}
        )
    return shaped


def _tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, str):
        return choice  # "none", "auto", "required" (chat refuses the rest)
    if choice.get("type") != "function":
        raise APIError(
            400,
            f'tool_choice.type: {choice.get("type")!r} is not served: {BUILT_IN}; send "auto", '
            '"required", "none" or {"type": "function", "name": ...}',
            "tool_choice.type",
            "unsupported_value",
        )
    return {"type": "function", "function": {"name": choice.get("name")}}


def _text_format(text: dict) -> dict:
    for key, value in text.items():
        if key != "format" and value is not None:
            raise APIError(400, f"text.{key} is not served; text takes format only", f"text.{key}", "unsupported_value")
    fmt = {"type": "text"} if text.get("format") is None else text["format"]  # false, 0, "" are no format
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(
            400, 'text.format.type must be "text", "json_object" or "json_schema"', "text.format.type", "invalid_value"
        )
    if fmt["type"] != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


# chat's field names in its errors -> the Responses fields (after the per-request message renames)
_RENAMES = [
    (re.compile(r"\btools\.(\d+)\.function\b"), r"tools.\1"),
    (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
    (re.compile(r"\bresponse_format\.json_schema\b"), "text.format"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
    (re.compile(r"\bmax_tokens\b"), "max_output_tokens"),
    (re.compile(r'"type": "text"'), '"type": "input_text"'),
]
_MESSAGE = re.compile(r"\bmessages\.(\d+)")


def renamed(error: APIError, names: dict[str, str] | None = None) -> APIError:
    """`error`, about a chat field, about the Responses field it came from (`names`: messages.N -> its input field;
    without them every message is "input")."""
    names = names or {}

    def rename(text: str | None) -> str | None:
        if text is None:
            return None
        text = _MESSAGE.sub(lambda m: names.get(m.group(0), "input"), text)
        for pattern, replacement in _RENAMES:
            text = pattern.sub(replacement, text)
        return text

    param = "input" if error.param == "messages" else rename(error.param)
    return APIError(error.status, rename(error.message), param, error.code, error.headers)


# -- streamed events ------------------------------------------------------------------------------


@dataclass
class Announced:
    """A function call a stream has announced: its ids and the arguments sent so far."""

    call_id: str
    name: str
    output_index: int
    arguments: str = ""


@dataclass
class ResponseEvents:
    """A streamed response's typed events, numbered, made from the chat stream's chunks (`chunk`: replies.Reply.piece
    and .closing, so a tool call streams as chat streams it): created, in_progress, each item's added event and its
    text or argument deltas as they come, then (`closing`, on the whole reply) each item's done events and
    response.completed (or response.incomplete, cut by max_output_tokens; response.failed)."""

    turn: Turn
    sequence: int = 0
    opened: bool = False  # the message item and its text part were announced
    calls: dict[int, Announced] = field(default_factory=dict)  # by the chat delta's tool-call index

    def opening(self) -> list[bytes]:
        return [
            self._event("response.created", response=self.turn.snapshot()),
            self._event("response.in_progress", response=self.turn.snapshot()),
        ]

    def chunk(self, chunk: dict) -> list[bytes]:
        """The events of one chat.completion.chunk: its text, its tool-call deltas."""
        delta = chunk["choices"][0]["delta"]
        events = []
        if delta.get("content"):
            events += ([] if self.opened else self._open_message()) + [self._delta(delta["content"])]
        for call in delta.get("tool_calls") or []:
            events += self._call_delta(call)
        return events

    def closing(self, chat: dict) -> list[bytes]:
        """The done events of each output item of the whole chat reply, then the finished Response."""
        for index, call in enumerate(chat["choices"][0]["message"].get("tool_calls") or []):
            if index in self.calls:  # the ids the stream announced (each presentation draws new ones)
                call["id"] = self.calls[index].call_id
        response = self.turn.response(chat)
        announced = {_item_id(a.call_id): a for a in self.calls.values()}
        events = []
        for index, item in enumerate(response["output"]):
            if item["type"] == "message":
                events += self._message_done(item, index)
            else:
                events += self._call_done(item, index, announced.get(item["id"]))
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return events + [self._event(kind, response=response)]

    def failed(self, error: APIError) -> bytes:
        body = error.body()["error"]
        response = {
            **self.turn.snapshot("failed"),
            "error": {"code": body["code"] or "server_error", "message": body["message"]},
        }
        return self._event("response.failed", response=response)

    def _open_message(self) -> list[bytes]:
        self.opened = True
        item = {
            "type": "message",
            "id": self.turn.message_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        return [
            self._event("response.output_item.added", output_index=0, item=item),
            self._event(
                "response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=_text_part("")
            ),
        ]

    def _delta(self, text: str) -> bytes:
        return self._event(
            "response.output_text.delta",
            item_id=self.turn.message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _message_done(self, item: dict, index: int) -> list[bytes]:
        text = item["content"][0]["text"]
        events = [] if self.opened else self._open_message() + ([self._delta(text)] if text else [])
        where = dict(item_id=item["id"], output_index=index, content_index=0)
        return events + [
            self._event("response.output_text.done", **where, text=text, logprobs=[]),
            self._event("response.content_part.done", **where, part=item["content"][0]),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_delta(self, call: dict) -> list[bytes]:
        function = call.get("function") or {}
        events = []
        if call["index"] not in self.calls:
            announced = Announced(call["id"], function.get("name", ""), int(self.opened) + len(self.calls))
            self.calls[call["index"]] = announced
            events.append(self._call_added(announced))
        announced = self.calls[call["index"]]
        if function.get("arguments"):
            announced.arguments += function["arguments"]
            events.append(self._arguments_delta(announced, function["arguments"]))
        return events

    def _call_done(self, item: dict, index: int, announced: Announced | None) -> list[bytes]:
        events = []
        if announced is None:
            announced = Announced(item["call_id"], item["name"], index)
            events.append(self._call_added(announced))
        rest = (
            item["arguments"][len(announced.arguments) :] if item["arguments"].startswith(announced.arguments) else ""
        )
        if rest:  # what the deltas have not sent (all of it, where the chat stream sends a call whole)
            events.append(self._arguments_delta(announced, rest))
        where = dict(item_id=item["id"], output_index=index)
        return events + [
            self._event(
                "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_added(self, announced: Announced) -> bytes:
        item = {
            "type": "function_call",
            "id": _item_id(announced.call_id),
            "call_id": announced.call_id,
            "name": announced.name,
            "arguments": "",
            "status": "in_progress",
        }
        return self._event("response.output_item.added", output_index=announced.output_index, item=item)

    def _arguments_delta(self, announced: Announced, text: str) -> bytes:
        return self._event(
            "response.function_call_arguments.delta",
            item_id=_item_id(announced.call_id),
            output_index=announced.output_index,
            delta=text,
        )

    def _event(self, kind: str, **fields) -> bytes:
        data = json.dumps({"type": kind, "sequence_number": self.sequence, **fields}, ensure_ascii=False)
        self.sequence += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()


def _item_id(call_id: str) -> str:
    """A function_call item's id, made from its call id, so the stream and the Response agree without a table."""
    return "fc_" + call_id.removeprefix("call_")
