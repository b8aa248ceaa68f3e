"""server/tool_stream.py on the template protocol: the content before the tagged calls streams as it is
written, and whatever the output turns out to be, the deltas join to the whole reply."""

from __future__ import annotations

import pytest

from jacobi_rt.runtime.tokenizer import TOOL_CALL_TAGS
from jacobi_rt.server.tool_calls import ToolCalls
from jacobi_rt.server.tool_stream import ToolDeltas

TAGS = ToolCalls(None, TOOL_CALL_TAGS, ("multiply",))
CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


def streamed(text: str, cut: bool = False) -> tuple[list[str], str, list[dict]]:
    """(content per character fed, the content joined with the closing's, the closing's calls)."""
    deltas = ToolDeltas(TAGS)
    pieces = ["".join(d.get("content", "") for d in deltas.feed(text[: i + 1])) for i in range(len(text))]
    closing = deltas.closing(text, cut)
    content = "".join(pieces) + "".join(d.get("content", "") for d in closing)
    return pieces, content, [c for d in closing for c in d.get("tool_calls", [])]


@pytest.mark.parametrize(
    "text",
    [
        "Let me check. " + CALL,  # content beside a call: stripped
        "  Leading space. " + CALL,  # nothing streams: the content beside the call has no space
        "No call at all, ends in a tag's start <tool",
        "A block that is no call " + "<tool_call>{oops}</tool_call>",  # all of it is content
        "Cut in the call " + CALL[:30],
    ],
)
def test_the_deltas_join_to_the_whole_reply(text):
    cut = text.endswith(CALL[:30])
    content, calls = TAGS.message(text, cut)
    _, joined, streamed_calls = streamed(text, cut)
    assert joined == (content or "")
    assert [c["function"] for c in streamed_calls] == [c["function"] for c in calls or []]


def test_the_content_before_a_call_streams_as_it_is_written():
    pieces, _, calls = streamed("Let me check. " + CALL)
    assert "".join(pieces) == "Let me check."  # the trailing space and the tag held back, the call at the end
    assert sum(1 for p in pieces if p) > 5 and len(calls) == 1
    assert "".join(streamed("  Leading space. " + CALL)[0]) == ""
