"""tool_choice "auto" over real HTTP: a chat template that renders tools (a Qwen2.5-style one, written
here over the tiny qwen2 artifact) gets them, the reply is the model's own output, and a call between the
template's <tool_call> tags comes back as OpenAI's tool_calls; a template without tools is a 400."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from templated import template_server  # noqa: E402

# Qwen2.5's layout, its wording cut short (the tiny artifact's context is 256 tokens): a system turn listing
# the tools as JSON lines and announcing the call format
TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Calls: <tool_call>{"name", "arguments"}</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
MESSAGES = [{"role": "user", "content": "Oslo?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
CALL = r'<tool_call>\{"name": "get_weather", "arguments": \{"c": [0-9]\}\}</tool_call>'


@pytest.fixture(scope="module")
def tools_server(artifact, tmp_path_factory):
    """The tiny qwen2 artifact with the template above (its files copied, its manifest pointing at the template)."""
    with template_server(artifact("qwen2"), tmp_path_factory.mktemp("qwen2-tools"), TEMPLATE) as served:
        yield served


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_auto_renders_the_tools_and_answers_the_models_own_text(tools_server):
    server, gen = tools_server
    tokenizer = gen.tokenizer
    assert tokenizer.takes_tools and tokenizer.tool_call_tags == ("<tool_call>", "</tool_call>")
    ids = tokenizer.encode(tokenizer.render_chat(MESSAGES, tools=[WEATHER]), add_special_tokens=False)
    assert len(ids) > len(tokenizer.encode(tokenizer.render_chat(MESSAGES), add_special_tokens=False)) + 40
    with client(server) as api:
        reply = api.chat.completions.create(model="qwen2", messages=MESSAGES, tools=[WEATHER], max_tokens=12)
    expected = gen.generate(ids, 12)
    assert reply.usage.prompt_tokens == len(ids)  # the tools were in the prompt
    assert "<tool_call>" not in expected.text  # a random model writes no call: the reply is its text
    assert reply.choices[0].message.content == expected.text and not reply.choices[0].message.tool_calls
    with client(server) as api:  # streamed, the content comes as it is written (tool_stream._sure_content)
        chunks = list(
            api.chat.completions.create(model="qwen2", messages=MESSAGES, tools=[WEATHER], max_tokens=12, stream=True)
        )
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(contents) == expected.text and (len(contents) > 2 or expected.text[:1].isspace())


def test_auto_reads_a_call_between_the_templates_tags(tools_server):
    """The call is the model's (here held to the call's shape by a regex, as a client may ask), read from its text."""
    server, gen = tools_server
    body = dict(
        model="qwen2",
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=90,
        extra_body={"structured_outputs": {"regex": CALL}},
    )
    with client(server) as api:
        reply = api.chat.completions.create(**body)
        chunks = list(api.chat.completions.create(**body, stream=True))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"c"}
    streamed = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])] if chunks else []
    assert [(d.function.name, d.function.arguments) for d in streamed] == [
        (call.function.name, call.function.arguments)
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" or chunks[-2].choices[0].finish_reason == "tool_calls"


def test_auto_on_a_template_without_tools_gets_the_generic_protocol(api):
    """The tiny llama's template renders no tools: "auto" is served by the generic protocol (tool_protocol.py)."""
    assert api.models.list().data[0].model_extra["jacobi"]["tools"] == "generic"
    reply = api.chat.completions.create(
        model="llama", messages=MESSAGES, tools=[WEATHER], max_tokens=2
    )  # 256-token context
    assert reply.usage.prompt_tokens > 100  # the tools described in a system message
    assert (reply.choices[0].message.content or "-")[0] not in "{["  # a call is never content
