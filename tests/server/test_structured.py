"""server/structured.py: response_format, structured_outputs and tools parsed into one Constraint, every
mistake a 400 naming its field; server/replies.py's tool_calls shape."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.runtime.generator import GenerationResult  # noqa: E402
from jacobi_rt.server.errors import APIError  # noqa: E402
from jacobi_rt.server.replies import Reply, ToolCalls  # noqa: E402
from jacobi_rt.server.schemas import parse_chat, parse_completion  # noqa: E402

HI = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "today's weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def chat(**fields):
    return parse_chat({"messages": HI, **fields}, allow_constraints=True)


def refused(parse, body: dict, param: str, says: str = "") -> APIError:
    with pytest.raises(APIError) as caught:
        parse(body, allow_constraints=True)
    error = caught.value
    assert error.status == 400 and error.param == param and says in error.message, (error.param, error.message)
    return error


@pytest.mark.parametrize(
    "fields, kind, where",
    [
        ({"response_format": {"type": "json_object"}}, "json_object", "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
                }
            },
            "json_schema",
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", "structured_outputs.json"),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json_schema", "structured_outputs.json"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "regex", "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'start: "a"+'}}, "grammar", "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "json_schema",
            "tools.0.function.parameters",
        ),
        ({"tools": [WEATHER, TIME], "tool_choice": "required"}, "json_schema", "tools"),
    ],
)
def test_each_field_becomes_a_constraint(fields, kind, where):
    call = chat(**fields)
    assert call.constraint is not None and call.constraint.kind == kind and call.constraint.where == where
    completion = {k: v for k, v in fields.items() if not k.startswith("tool")}
    if completion:
        assert parse_completion({"prompt": "hi", **completion}, allow_constraints=True).constraint == call.constraint


def test_no_constraint():
    assert chat().constraint is None
    assert chat(response_format={"type": "text"}).constraint is None
    call = chat(tools=[WEATHER], tool_choice="none")
    assert call.constraint is None and call.tools is None


def test_tool_choice_shapes_the_reply():
    assert chat(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ).tools == ToolCalls("get_weather")
    call = chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert call.tools == ToolCalls(None, names=("get_weather", "get_time"), parallel=False)
    schema = call.constraint.value
    assert schema["maxItems"] == 1 and [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == [
        "get_weather",
        "get_time",
    ]


@pytest.mark.parametrize(
    "parse, body, param, says",
    [
        (
            parse_chat,
            {
                "messages": HI,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
            },
            "response_format.json_schema.schema",
            "Invalid type",
        ),
        (
            parse_chat,
            {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "required",
        ),
        (
            parse_chat,
            {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
            "name",
        ),
        (parse_chat, {"messages": HI, "response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
        (
            parse_chat,
            {"messages": HI, "response_format": {"type": "json_object", "schema": SCHEMA}},
            "response_format.schema",
            "",
        ),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"regex": "("}},
            "structured_outputs.regex",
            "unclosed group",
        ),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"choice": []}},
            "structured_outputs.choice",
            "non-empty",
        ),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"grammar": "start: nowhere"}},
            "structured_outputs.grammar",
            "nowhere",
        ),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"json": "{not json"}},
            "structured_outputs.json",
            "must be JSON",
        ),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
            "exactly one",
        ),
        (parse_completion, {"prompt": "hi", "structured_outputs": {}}, "structured_outputs", "exactly one"),
        (
            parse_completion,
            {"prompt": "hi", "structured_outputs": {"structural_tag": "x"}},
            "structured_outputs.structural_tag",
            "",
        ),
        (
            parse_completion,
            {"prompt": "hi", "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "send one",
        ),
        (
            parse_chat,
            {"messages": HI, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
            "not among",
        ),
        (
            parse_chat,
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "bad name"}}],
                "tool_choice": "required",
            },
            "tools.0.function.name",
            "",
        ),
        (
            parse_chat,
            {"messages": HI, "tools": [WEATHER, WEATHER], "tool_choice": "required"},
            "tools.1.function.name",
            "twice",
        ),
        (
            parse_chat,
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools.0.function.parameters",
            "",
        ),
        (parse_chat, {"messages": HI, "tool_choice": "required"}, "tool_choice", "no tools"),
    ],
)
def test_mistakes_are_400s_naming_the_field(parse, body, param, says):
    refused(parse, body, param, says)


@pytest.mark.parametrize(
    "parse, body, param",
    [
        (parse_chat, {"messages": HI, "response_format": {"type": "json_object"}}, "response_format"),
        (parse_completion, {"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        (parse_completion, {"prompt": "hi", "structured_outputs": {"regex": "a"}}, "structured_outputs"),
        (parse_chat, {"messages": HI, "tools": [WEATHER], "tool_choice": "required"}, "tools"),
    ],
)
def test_a_server_that_does_not_constrain_refuses_them(parse, body, param):
    with pytest.raises(APIError) as caught:
        parse(body)
    assert caught.value.status == 400 and caught.value.param == param and caught.value.code == "unsupported_value"


def result(text: str, finish: str = "eos") -> GenerationResult:
    from types import SimpleNamespace

    stats = SimpleNamespace(
        finish_reason=finish,
        prompt_tokens=3,
        new_tokens=5,
        strategy="auto",
        window=8,
        adaptive=False,
        target_passes=2,
        tokens_per_pass=2.5,
        prefill_passes=1,
        decode_tokens_per_second=10.0,
        wall_seconds=0.5,
        seed=None,
        cached_tokens=0,
        constraint=None,
    )
    return SimpleNamespace(text=text, stats=stats, logprobs=None)


def test_tool_calls_in_openais_shape():
    named = Reply("m", chat=True, tools=ToolCalls("get_weather")).whole([result('{"city": "Oslo"}')])
    choice = named["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    required = Reply("m", chat=True, tools=ToolCalls(None)).whole(
        [result('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]')]
    )
    calls = required["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome"}
    cut = Reply("m", chat=True, tools=ToolCalls("get_weather")).whole([result('{"city": "Os', "length")])
    message = cut["choices"][0]["message"]  # a cut call stays a call (issue 37), its arguments as far as written
    assert cut["choices"][0]["finish_reason"] == "length" and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Os'}


def test_streamed_tool_calls_come_as_openais_deltas():
    """A named call: its first delta (index, id, type, name, arguments "") at once, then arguments fragments
    as written; joined they are the whole reply's arguments."""
    reply = Reply("m", chat=True, tools=ToolCalls("get_weather"))
    first = [c["choices"][0]["delta"] for c in reply.piece('{"ci')]
    assert first[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert first[0]["tool_calls"][0]["id"].startswith("call_") and first[0]["tool_calls"][0]["type"] == "function"
    assert first[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    later = [c["choices"][0]["delta"] for c in reply.piece('ty": "Oslo"}')]
    closing = reply.closing(result('{"city": "Oslo"}'))
    assert later == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}]
    assert [c["choices"][0]["finish_reason"] for c in closing] == ["tool_calls"] and closing[0]["choices"][0][
        "delta"
    ] == {}


def test_generic_auto_reads_a_call_an_array_or_a_plain_answer():
    """The generic protocol's text form (the turn after tool results)."""
    generic = ToolCalls(None, names=("get_weather", "get_time"), generic="text")
    one = generic.message('{"name": "get_time", "arguments": {}}', cut=False)
    assert one[0] is None and [c["function"] for c in one[1]] == [{"name": "get_time", "arguments": "{}"}]
    two = generic.message(
        '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]', cut=False
    )
    assert [c["function"]["arguments"] for c in two[1]] == ["{}", '{"city": "Oslo"}']
    assert generic.message("It is sunny.", cut=False) == ("It is sunny.", None)
    assert generic.message('{"name": "get_w', cut=True)[1][0]["function"] == {"name": "get_weather", "arguments": ""}
    reply = Reply("m", chat=True, tools=generic)
    assert reply.piece("") == [] and [c["choices"][0]["delta"] for c in reply.piece("It")] == [{"content": "It"}]


def test_generic_auto_json_form_reads_a_call_or_a_response_as_written():
    """The generic protocol's json form: {"tool_call": CALL} is a call, {"response": TEXT} is TEXT as content,
    streamed as it is decoded (an escape cut short held back), and each piece's deltas join to the whole reply."""
    generic = ToolCalls(None, names=("get_weather", "get_time"), generic="json")
    call = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}'
    content, calls = generic.message(call, cut=False)
    assert content is None and [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    ]
    assert generic.message(call[:40], cut=True)[1][0]["function"]["name"] == "get_weather"
    answer = '{"response": "It is \\"sunny\\" \\u00e9t\\u00e9 \\ud83d\\ude00."}'
    assert generic.message(answer, cut=False) == ('It is "sunny" été 😀.', None)
    reply = Reply("m", chat=True, tools=generic)
    deltas = [c["choices"][0]["delta"] for char in answer for c in reply.piece(char)]
    assert "".join(d.get("content", "") for d in deltas) == 'It is "sunny" été 😀.'
    assert all(d.get("content") for d in deltas) and "\ufffd" not in "".join(d["content"] for d in deltas)


def test_auto_reads_calls_between_the_templates_tags():
    """tool_choice "auto": text stays content; tagged calls of offered tools become tool_calls, the text before
    them the content; a tagged block that is no call of an offered tool leaves the whole reply as text."""
    auto = ToolCalls(None, ("<tool_call>", "</tool_call>"), ("get_weather", "get_time"))
    plain = Reply("m", chat=True, tools=auto).whole([result("It is sunny.")])
    assert (
        plain["choices"][0]["finish_reason"] == "stop" and plain["choices"][0]["message"]["content"] == "It is sunny."
    )
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    choice = Reply("m", chat=True, tools=auto).whole([result(text)])["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me look."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]
    ] == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    for bad in (
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "get_time", "arguments": 3}</tool_call>',
    ):
        choice = Reply("m", chat=True, tools=auto).whole([result(bad)])["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"] == bad
