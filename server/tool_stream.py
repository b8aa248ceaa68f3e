"""A streamed reply with tools, as OpenAI streams it: content deltas, and per call a first delta (index,
id, type, function name, arguments "") then its arguments in fragments, each sent once it is written.

`ToolDeltas.feed(text)` takes the output so far and returns the deltas it adds; fed the whole output
at the end, what was sent joins to the whole reply (ToolCalls.message). The template's tagged calls
(`ToolCalls.streams` False) are sent at the end only: the model writes them unconstrained, so a text
is known to be a call only once the whole output is read. The content before them streams as far as it is
content whatever the end brings (`_sure_content`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tool_calls import Call, ToolCalls, call_id


@dataclass
class ToolDeltas:
    """What one choice's stream has sent so far, and the deltas a longer text adds to it."""

    tools: ToolCalls
    content: str = ""
    calls: list[Call] = field(default_factory=list)  # each call sent, with the arguments sent so far

    def feed(self, text: str) -> list[dict]:
        """The deltas (chat `delta` objects, one a chunk) that `text` adds to what was sent."""
        if not self.tools.streams:
            return self._content_delta(_sure_content(text, self.tools.tags[0]))
        progress = self.tools.progress(text)
        deltas = []
        if (
            progress.content is not None
            and progress.content.startswith(self.content)
            and progress.content != self.content
        ):
            deltas.append({"content": progress.content[len(self.content) :]})
            self.content = progress.content
        for index, call in enumerate(progress.calls):
            if index == len(self.calls):
                self.calls.append(Call(call.name, ""))
                deltas.append(
                    _entry(index, id=call_id(), type="function", function={"name": call.name, "arguments": ""})
                )
            sent = self.calls[index]
            if call.arguments != sent.arguments and call.arguments.startswith(sent.arguments):
                deltas.append(_entry(index, function={"arguments": call.arguments[len(sent.arguments) :]}))
                self.calls[index] = call
        return deltas

    def closing(self, text: str, cut: bool) -> list[dict]:
        """What is left to send once the output has ended: the rest, or (tagged calls) the content not yet sent
        and the calls."""
        if self.tools.streams:
            return self.feed(text)
        content, calls = self.tools.message(text, cut)
        rest = (content or "")[len(self.content) :]  # what was sent is a prefix of the content (_sure_content)
        delta = {"content": rest} if rest else {}
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return [delta] if delta else []

    def _content_delta(self, content: str) -> list[dict]:
        if len(content) <= len(self.content):
            return []
        sent, self.content = self.content, content
        return [{"content": content[len(sent) :]}]

    @property
    def called(self) -> bool:
        return bool(self.calls)


def _entry(index: int, **fields) -> dict:
    return {"tool_calls": [{"index": index, **fields}]}


def _sure_content(text: str, opening: str) -> str:
    """The beginning of a template-protocol output that is its content however it ends: whole, when no call
    parses, or stripped before the first tag, beside the calls (ToolCalls.message). So: the text before the
    tag and before any end that may begin one, trailing whitespace held back, and nothing at all while the
    text begins with whitespace (which the stripped content would not have)."""
    head = text.split(opening, 1)[0]
    if not head or head[0].isspace():
        return ""
    for k in range(min(len(opening) - 1, len(head)), 0, -1):
        if head.endswith(opening[:k]):
            head = head[:-k]
            break
    return head.rstrip()
