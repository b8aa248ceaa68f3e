"""A tool round trip over real HTTP: the call the server returned is sent back as the frameworks send it
(an assistant message with tool_calls and content null, then a tool message with its tool_call_id), and
the next turn's prompt holds the result: through the generic rendering on SmolLM2 (its template knows no
tools), and through a template that renders tool calls and results itself."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from templated import template_server  # noqa: E402

from jacobi_rt.server.replies import ToolCalls  # noqa: E402

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "a times b",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    },
}
QUESTION = [{"role": "user", "content": "What is 6 times 7? Use the tool."}]


def test_a_tool_round_trip_on_smollm2_with_the_official_client(start_server, generator):
    server = start_server("smollm2-135m")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as api:
        first = api.chat.completions.create(
            model="smollm2-135m",
            messages=QUESTION,
            tools=[MULTIPLY],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=40,
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "multiply" and set(arguments) == {"a", "b"}
        # as LangChain / openai-agents send it (content null), and as the client echoes the message back
        sent_back = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": "multiply", "arguments": call.function.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "42"},
        ]
        echoed = [choice.message.model_dump(), sent_back[1]]
        replies = [
            api.chat.completions.create(
                model="smollm2-135m", messages=QUESTION + history, tools=[MULTIPLY], tool_choice="none", max_tokens=12
            )
            for history in (sent_back, echoed)
        ]
    # the generic rendering, written out: the call as the JSON "required" makes the model write, the result a user turn
    rendered = QUESTION + [
        {"role": "assistant", "content": json.dumps([{"name": "multiply", "arguments": arguments}])},
        {"role": "user", "content": "Tool result of multiply:\n42\n\nAnswer the question with this result."},
    ]
    expected = generator("smollm2-135m").generate(messages=rendered, max_new_tokens=12, strategy="greedy")
    for reply in replies:
        assert reply.usage.prompt_tokens == expected.stats.prompt_tokens
        assert reply.choices[0].message.content == expected.text


# A Hugging Face-style template that renders tool calls (arguments | tojson: a dict, as HF passes them) and tool turns
TEMPLATE = """{% for m in messages %}<|im_start|>{{ m['role'] }}
{% if m['role'] == 'assistant' and m.tool_calls %}{% for c in m.tool_calls %}\
<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% elif m['role'] == 'tool' %}\
<tool_response id={{ m.tool_call_id }}>{{ m['content'] }}</tool_response>\
{% else %}{{ m['content'] }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def history_server(artifact, tmp_path_factory):
    """The tiny qwen2 artifact with the template above (its files copied, its manifest pointing at the template)."""
    with template_server(artifact("qwen2"), tmp_path_factory.mktemp("qwen2-history"), TEMPLATE) as served:
        yield served


def test_a_template_that_knows_tools_renders_the_calls_and_results(history_server):
    server, gen = history_server
    messages = [
        {"role": "user", "content": "6*7?"},
        {
            "role": "assistant",
            "tool_calls": [  # pydantic-ai leaves content out
                {"id": "call_7", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "42"},
    ]
    body = {"model": "qwen2", "messages": messages, "max_tokens": 4}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    written = (
        '<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n<tool_call>{"name": "multiply", "arguments": '
        '{"a": 6, "b": 7}}</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response id=call_7>42</tool_response>'
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = gen.tokenizer.encode(written, add_special_tokens=False)
    assert reply["usage"]["prompt_tokens"] == len(ids)
    assert reply["choices"][0]["message"]["content"] == gen.generate(ids, 4).text


def test_a_legacy_function_result_is_rendered_by_name(history_server):
    server, gen = history_server
    messages = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": None, "function_call": {"name": "multiply", "arguments": "{}"}},
        {"role": "function", "name": "multiply", "content": "42"},
    ]
    response = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "qwen2", "messages": messages, "max_tokens": 2}, timeout=60
    )
    assert response.status_code == 200, response.text


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = (
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    both = ToolCalls(None, ("<tool_call>", "</tool_call>"), ("f",)).calls(text)
    one = ToolCalls(None, ("<tool_call>", "</tool_call>"), ("f",), parallel=False).calls(text)
    assert len(both) == 2 and [c["function"]["arguments"] for c in one] == ['{"x": 1}']


def test_a_call_cut_by_max_tokens_comes_back_in_tool_calls(start_server):
    """finish_reason "length" with the call begun in tool_calls (its arguments as far as written), never the
    internal [{"name": ...}] wrapper as content; streamed and not, "required" and a named tool."""
    server = start_server("smollm2-135m")
    named = {"type": "function", "function": {"name": "multiply"}}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as api:
        for choice, tokens in (("required", 14), (named, 4)):
            body = dict(
                model="smollm2-135m", messages=QUESTION, tools=[MULTIPLY], tool_choice=choice, max_tokens=tokens
            )
            whole = api.chat.completions.create(**body).choices[0]
            chunks = list(api.chat.completions.create(**body, stream=True))
            assert whole.finish_reason == "length" and whole.message.content is None, whole
            (call,) = whole.message.tool_calls
            assert call.function.name == "multiply" and call.function.arguments  # begun, unfinished
            with pytest.raises(ValueError):
                json.loads(call.function.arguments)
            streamed = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
            assert {d.index for d in streamed} == {0} and streamed[
                0
            ].function.name == "multiply"  # the first delta names it
            assert "".join(d.function.arguments for d in streamed) == call.function.arguments  # then its arguments
            assert not any(c.choices[0].delta.content for c in chunks if c.choices)
            assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
                "length"
            ]


def test_the_generic_rendering_names_calls_by_place_not_by_their_random_ids():
    """The same conversation renders the same prompt whatever ids the server drew (an id in the prompt changed
    SmolLM2's answer from run to run), and a run of results ends asking for the answer."""
    from jacobi_rt.server.history import for_template

    def conversation(ids: list[str]) -> list[dict]:
        calls = [
            {"id": i, "type": "function", "function": {"name": "multiply", "arguments": {"a": n, "b": 7}}}
            for n, i in enumerate(ids)
        ]
        return [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            *(
                {"role": "tool", "content": str(7 * n), "tool_call_id": i, "name": "multiply"}
                for n, i in enumerate(ids)
            ),
        ]

    two = for_template(conversation(["call_x", "call_y"]), None)
    assert two == for_template(conversation(["call_p", "call_q"]), None)
    assert two[-1] == {
        "role": "user",
        "content": "Tool result of multiply (call 1):\n0\n\nTool result of multiply (call 2):\n7"
        "\n\nAnswer the question with these results.",
    }
    assert for_template(conversation(["call_z"]), None)[-1]["content"] == (
        "Tool result of multiply:\n0\n\nAnswer the question with this result."
    )
