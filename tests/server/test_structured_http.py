"""Structured output over real HTTP with the `openai` client: response_format, structured_outputs and tools
answered by the engine (each reply the Generator's own constrained output), tool_calls in OpenAI's shape,
bad schemas a 400 before any work, and constrained and free clients at once."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.runtime.constraints import Constraint  # noqa: E402
from jacobi_rt.server.tool_protocol import listed  # noqa: E402

MESSAGES = [{"role": "user", "content": "Describe a pet."}]
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "kind"],
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "kind": {"enum": ["cat", "dog", "fish"]},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 10}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "properties": {}}},
}


def test_chat_json_schema_is_the_generators_constrained_output(api, gen):
    reply = api.chat.completions.create(
        model="llama",
        messages=MESSAGES,
        max_tokens=60,
        extra_body={"jacobi": {"strategy": "auto"}},
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}},
    )
    expected = gen.generate(messages=MESSAGES, max_new_tokens=60, constraint=Constraint.json_schema(SCHEMA))
    choice = reply.choices[0]
    assert choice.message.content == expected.text and choice.finish_reason == "stop"
    value = json.loads(choice.message.content)
    assert set(value) == {"name", "age", "kind"} and value["kind"] in ("cat", "dog", "fish")
    assert reply.model_extra["jacobi"]["tokens_per_pass"] > 1.0  # the forced runs went in as guesses
    cost = reply.model_extra["jacobi"][
        "constraint"
    ]  # what the masks cost, for clients measuring it (benchmarks/structured_load)
    assert (
        cost["mask_seconds"] > 0
        and cost["mask_rows"] >= reply.model_extra["jacobi"]["target_passes"]
        and cost["complete"]
    )


def test_completions_structured_outputs_and_json_object(api, gen):
    reply = api.completions.create(
        model="llama",
        prompt="The answer is",
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe not"]}},
    )
    assert reply.choices[0].text in ("yes", "no", "maybe not") and reply.choices[0].finish_reason == "stop"
    assert (
        reply.choices[0].text
        == gen.generate("The answer is", 20, constraint=Constraint.choice(["yes", "no", "maybe not"])).text
    )
    regex = api.completions.create(
        model="llama", prompt="Code:", max_tokens=20, extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}}
    )
    assert regex.choices[0].text == gen.generate("Code:", 20, constraint=Constraint.regex("[A-Z]{2}-[0-9]{3}")).text
    as_object = api.completions.create(
        model="llama", prompt="A JSON object:", max_tokens=12, extra_body={"response_format": {"type": "json_object"}}
    )
    assert as_object.choices[0].text.startswith("{")


def test_a_schema_that_cannot_finish_in_max_tokens_is_length(api):
    reply = api.chat.completions.create(
        model="llama",
        messages=MESSAGES,
        max_tokens=5,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}},
    )
    assert reply.choices[0].finish_reason == "length"


def test_named_tool_and_required_tools_answer_tool_calls(api, gen):
    # one tool: the tools listed in the prompt (tool_protocol.listed) must fit the tiny llama's 256 tokens
    named = api.chat.completions.create(
        model="llama",
        messages=MESSAGES,
        max_tokens=40,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert set(json.loads(call.function.arguments)) == {"city"}
    # the tiny llama's template renders no tools: they are listed in a system message (tool_protocol.listed)
    expected = gen.generate(
        messages=listed(MESSAGES, [WEATHER["function"]]),
        max_new_tokens=40,
        constraint=Constraint.json_schema(WEATHER["function"]["parameters"]),
    )
    assert call.function.arguments == expected.text

    required = api.chat.completions.create(
        model="llama", messages=MESSAGES, max_tokens=80, tools=[WEATHER, TIME], tool_choice="required"
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time") and isinstance(
            json.loads(call.function.arguments), dict
        )


def test_a_streamed_tool_call_comes_as_deltas_that_join_to_the_whole_call(api):
    body = dict(
        model="llama",
        messages=MESSAGES,
        max_tokens=40,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (whole,) = api.chat.completions.create(**body).choices[0].message.tool_calls
    chunks = list(api.chat.completions.create(**body, stream=True))
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert closing.choices[0].finish_reason == "tool_calls"
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == "" and deltas[0].id
    assert len(deltas) > 2 and all(d.function.name is None for d in deltas[1:])  # fragments as they are committed
    assert "".join(d.function.arguments for d in deltas) == whole.function.arguments


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
            "response_format.json_schema.schema",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "("}}}, "structured_outputs.regex"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
    ],
)
def test_bad_constraints_are_400s_naming_the_field(api, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=10, **body)
    assert caught.value.body["param"] == param


def test_constrained_and_free_clients_at_once_get_their_solo_answers(start_server, gen):
    server = start_server(max_batch=8)
    prompts = [f"Pet number {i}:" for i in range(8)]
    answers: dict[int, tuple] = {}

    def ask(i: int) -> None:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            extra = (
                {"response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}}
                if i % 2
                else {}
            )
            reply = client.completions.create(model="llama", prompt=prompts[i], max_tokens=40, extra_body=extra)
            answers[i] = (reply.choices[0].text, reply.choices[0].finish_reason)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.stop()
    for i, prompt in enumerate(prompts):
        constraint = Constraint.json_schema(SCHEMA) if i % 2 else None
        assert answers[i][0] == gen.generate(prompt, 40, constraint=constraint).text, i
        if i % 2 and answers[i][1] == "stop":
            json.loads(answers[i][0])


@pytest.mark.parametrize("tokens, text", [(1, ""), (4, "日本")])  # SmolLM2 writes 日 and 語 in 2 and 3 byte tokens
def test_a_text_cut_inside_a_character_drops_its_bytes(start_server, tokens, text):
    """max_tokens stops the output inside a character: the text ends before it, never in U+FFFD (streamed too)."""
    server = start_server("smollm2-135m")
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": tokens,
        "structured_outputs": {"regex": "日本語"},
    }
    with httpx.Client(base_url=server.url, timeout=60) as c:
        reply = c.post("/v1/chat/completions", json=body).json()
        streamed = c.post("/v1/chat/completions", json={**body, "stream": True}).text
    assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == tokens
    assert reply["choices"][0]["message"]["content"] == text
    pieces = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in pieces if p["choices"]) == text


TREE = {
    "type": "object",
    "required": ["value"],
    "properties": {  # recursive, finite: children are optional
        "value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
}


@pytest.mark.parametrize(
    "body, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "extra_body": {
                    "structured_outputs": {
                        "json": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#"}}}
                    }
                }
            },
            "structured_outputs.json",
        ),
        ({"extra_body": {"structured_outputs": {"grammar": 'root ::= "a" root'}}}, "structured_outputs.grammar"),
        (
            {"extra_body": {"structured_outputs": {"grammar": 'start: x\nx: "a" y\ny: "b" x'}}},
            "structured_outputs.grammar",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_a_constraint_with_no_finite_output_is_a_400_before_any_work(client, body, param):
    """Refused as the request is parsed, naming the field; streamed requests too (no 200, then an error event)."""
    fields = {k: v for k, v in body.items() if k != "extra_body"} | body.get("extra_body", {})
    for stream in (False, True):
        response = client.post(
            "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 10, "stream": stream, **fields}
        )
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert "finite" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE}}},
        {"structured_outputs": {"grammar": 'root ::= "(" root? ")"'}},
        {"structured_outputs": {"grammar": 'start: x{0,2}\nx: "a" x'}},
    ],
)
def test_a_recursive_constraint_with_finite_outputs_is_served(client, body):
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 6, **body})
    assert response.status_code == 200, response.text
