"""How a chat reply with tools reads its output: OpenAI's `tool_calls`, or `content`, from the text written.

One reader serves the whole reply and the stream: `progress(text)` is what the text written so far
says (the content known to be a plain answer, the calls begun with their arguments as written), and
each later text's progress extends the earlier one's, so the deltas a stream sends join to the
whole reply. A call's `arguments` is the JSON text the model wrote, never re-serialized.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Literal

_DECODER = json.JSONDecoder()
_CALL_START = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_CUT_NAME = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)(?:"[\s,":a-z]*)?$')  # cut in or just after a name
_JSON_CALL, _JSON_ANSWER = '{"tool_call": ', '{"response": "'  # the generic json form, its separators fixed

GenericForm = Literal["json", "text"]  # the generic protocol's two forms (server/tool_protocol.py)


@dataclass(frozen=True)
class Call:
    """One call begun: its function and its arguments' JSON text as written so far (whole once complete)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Progress:
    """What an output says so far: `content` once it is known to be a plain answer, and the calls begun."""

    content: str | None
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class ToolCalls:
    """How a chat reply with tools is presented: as OpenAI's `tool_calls` where the output is a call.

    name: the named function (tool_choice {"type": "function", ...}): the output is its arguments
    object. None (tool_choice "required"): the output is a JSON array of {"name", "arguments"}.
    generic (tool_choice "auto" by the generic protocol, server/tool_protocol.py): in its "json" form the
    output is {"tool_call": CALL} or {"response": TEXT} (the content: TEXT decoded as it is written); in its
    "text" form a call object, an array of them, or a plain answer (text that starts with neither "{" nor "[").
    tags (tool_choice "auto", where the chat template renders the tools): the output is free text, a
    call being a JSON {"name", "arguments"} object between the two tags the template announced
    (`names`: the functions offered); the text before the first call is the message's content.
    An output cut short (finish "length") is presented as OpenAI presents it: the calls begun, the last one's
    arguments the JSON text written so far; a call whose name is not yet written is left out
    unless the name's beginning picks one offered function.
    """

    name: str | None
    tags: tuple[str, str] | None = None
    names: tuple[str, ...] = ()
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only (the grammar holds "required" to one)
    generic: GenericForm | None = None

    @property
    def streams(self) -> bool:
        """Whether a stream can send calls as they are written (all but the template's tags, which the model
        writes unconstrained, so a call is known only once the whole output is read)."""
        return self.tags is None

    def progress(self, text: str) -> Progress:
        """What `text` (an output, or its beginning) says; not for `tags`."""
        if self.name is not None:
            return Progress(None, (Call(self.name, text),))
        if self.generic == "json":
            if text.startswith(_JSON_CALL):
                return Progress(None, self._begun(text[len(_JSON_CALL) :])[:1])
            if text.startswith(_JSON_ANSWER):
                return Progress(_string_so_far(text[len(_JSON_ANSWER) :]), ())
            return Progress(None, ())
        if self.generic == "text":
            if not text:
                return Progress(None, ())
            if text[0] == "{":
                return Progress(None, self._begun(text)[:1])
            if text[0] != "[":
                return Progress(text, ())
        return Progress(None, self._begun(text.lstrip()[1:]))

    def message(self, text: str, cut: bool) -> tuple[str | None, list[dict] | None]:
        """(content, tool_calls) of a finished output (`cut`: by max_tokens or the context)."""
        if self.tags is None:
            progress = self.progress(text)
            return progress.content, [call_dict(call) for call in progress.calls] or None
        if cut and self.tags[0] in text:
            return self.content(text), self.partial(text) or None
        calls = self.calls(text)
        return (self.content(text), calls) if calls else (text, None)

    def calls(self, text: str) -> list[dict] | None:
        """The template's tagged calls in a finished output (None where there is none, or one is no call)."""
        try:
            pairs = self._tagged(text)
        except (ValueError, TypeError, KeyError):
            return None
        return [call_dict(call) for call in pairs[: None if self.parallel else 1]] or None

    def partial(self, text: str) -> list[dict]:
        """The template's tagged calls begun in an output cut short, the last one's arguments unfinished."""
        blocks = text.split(self.tags[0])[1:]
        begun = [call for block in blocks for call in self._begun(block.split(self.tags[1], 1)[0])]
        return [call_dict(call) for call in begun[: None if self.parallel else 1]]

    def content(self, text: str) -> str | None:
        """The text before the template's first tagged call, as the message's content beside its calls."""
        return text.split(self.tags[0], 1)[0].strip() or None

    def _begun(self, text: str) -> tuple[Call, ...]:
        """Each {"name": ..., "arguments": ...} object begun in `text` (the grammar writes name first)."""
        calls, starts = [], set()
        for start in _CALL_START.finditer(text):
            starts.add(start.start())
            name = self._named(start.group(1))
            if name is not None:
                calls.append(Call(name, _value_text(text[start.end() :])))
        cut = _CUT_NAME.search(text)
        if cut and cut.start() not in starts and (name := self._named(cut.group(1), partial=True)) is not None:
            calls.append(Call(name, ""))
        return tuple(calls if self.parallel else calls[:1])

    def _named(self, written: str, partial: bool = False) -> str | None:
        if not partial:
            return written if not self.names or written in self.names else None
        matching = [n for n in self.names if n.startswith(written)]
        return matching[0] if len(matching) == 1 else None

    def _tagged(self, text: str) -> list[Call]:
        """Each tagged call; a block that is no call of an offered function raises ValueError."""
        opening, closing = self.tags
        calls = []
        for block in re.findall(re.escape(opening) + r"(.*?)" + re.escape(closing), text, re.S):
            call = json.loads(block)
            if not isinstance(call, dict) or call.get("name") not in self.names:
                raise ValueError(f"not a call of one of the tools: {block[:80]!r}")
            arguments = call.get("arguments", call.get("parameters"))
            if not isinstance(arguments, dict):
                raise ValueError(f"not a call of one of the tools: {block[:80]!r}")
            calls.append(Call(call["name"], json.dumps(arguments, ensure_ascii=False)))
        return calls


def _value_text(text: str) -> str:
    """The JSON value at the start of `text` as written: up to its end when complete, else all of it
    (so the text an unfinished value has so far is a prefix of what it will be)."""
    try:
        _, end = _DECODER.raw_decode(text)
    except ValueError:
        return text
    return text[:end]


def _string_so_far(text: str) -> str:
    """The JSON string whose body starts `text`, decoded up to its closing quote, or, unfinished, up to its last
    whole character (an escape cut short is held back, so that each later text's string extends this one)."""
    i = 0
    while i < len(text) and text[i] != '"':
        if text[i] != "\\":
            i += 1
            continue
        step = 6 if text[i + 1 : i + 2] == "u" else 2
        if step == 6 and 0xD800 <= int(text[i + 2 : i + 6].ljust(4, "0"), 16) < 0xDC00:
            step = 12  # a surrogate pair: both halves or neither
        if i + step > len(text):
            break
        i += step
    return json.loads('"' + text[:i] + '"')


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_dict(call: Call) -> dict:
    """One call in OpenAI's shape, with a new id."""
    return {"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
