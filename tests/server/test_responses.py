"""The Responses API (`POST /v1/responses`) over real HTTP on SmolLM2-135M with the official `openai` client:
each answer is the chat endpoint's for the same conversation (greedy, and seeded sampling), tool calls and
their results round-trip as items, text.format constrains, a stream's typed events come in order and
reassemble to the whole answer, previous_response_id continues a stored conversation, and what is not
served is a 400 naming the field."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from jacobi_rt.server.responses import ResponseStore  # noqa: E402
from jacobi_rt.server.run import BackgroundServer  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402

MODEL = "smollm2-135m"
MULTIPLY = {
    "type": "function",
    "name": "multiply",
    "description": "a times b",
    "strict": True,
    "parameters": {
        "type": "object",
        "additionalProperties": False,
        "required": ["a", "b"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    },
}
CHAT_MULTIPLY = {"type": "function", "function": {k: v for k, v in MULTIPLY.items() if k != "type"}}
QUESTION = "What is 6 times 7? Use the tool."


@pytest.fixture(scope="module")
def server(generator):
    with BackgroundServer(generator(MODEL), ServerSettings(model_id=MODEL, docs=True)) as served:
        yield served


@pytest.fixture(scope="module")
def api(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def chat_text(api, messages: list[dict], max_tokens: int, **fields) -> tuple[str, object]:
    reply = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, **fields)
    return reply.choices[0].message.content, reply


def test_a_string_input_answers_as_chat_does(api):
    response = api.responses.create(model=MODEL, input="Say something.", max_output_tokens=12)
    text, chat = chat_text(api, [{"role": "user", "content": "Say something."}], 12)
    assert response.output_text == text and response.object == "response" and response.id.startswith("resp_")
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert (
        usage.total_tokens == usage.input_tokens + usage.output_tokens
        and usage.output_tokens_details.reasoning_tokens == 0
    )
    assert chat.choices[0].finish_reason == "length"  # 12 tokens cut it: the Response says so
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert item.status == "incomplete"


def test_items_and_instructions_are_the_chat_messages(api):
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ada."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello Ada!", "annotations": []}],
        },
        {"role": "user", "content": "Tell me a fact about cats."},
    ]
    response = api.responses.create(
        model=MODEL, input=items, instructions="Answer in one sentence.", max_output_tokens=16
    )
    messages = [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "Hi, I am Ada."},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "Tell me a fact about cats."},
    ]
    text, chat = chat_text(api, messages, 16)
    assert response.output_text == text and response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.instructions == "Answer in one sentence."


def test_sampling_fields_are_honoured_as_chat_honours_them(api):
    fields = dict(temperature=1.0, top_p=0.9)
    response = api.responses.create(
        model=MODEL, input="Name a colour.", max_output_tokens=10, **fields, extra_body={"seed": 5, "top_k": 40}
    )
    text, _ = chat_text(
        api, [{"role": "user", "content": "Name a colour."}], 10, **fields, seed=5, extra_body={"top_k": 40}
    )
    greedy = api.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=10)
    assert response.output_text == text and response.model_extra["jacobi"]["seed"] == 5
    assert response.temperature == 1.0 and response.top_p == 0.9
    assert greedy.model_extra["jacobi"]["seed"] is None


def test_a_function_tool_round_trip(api):
    first = api.responses.create(
        model=MODEL,
        input=QUESTION,
        tools=[MULTIPLY],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "multiply" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"a", "b"}
    assert first.tools[0].name == "multiply" and first.tool_choice == "required"
    # the second turn as the openai-agents SDK sends it: the call item echoed, then its output
    items = [
        {"role": "user", "content": QUESTION},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
    ]
    second = api.responses.create(model=MODEL, input=items, tools=[MULTIPLY], tool_choice="none", max_output_tokens=12)
    chained = api.responses.create(
        model=MODEL,
        input=items[2:],
        previous_response_id=first.id,
        tools=[MULTIPLY],
        tool_choice="none",
        max_output_tokens=12,
    )
    history = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": "multiply", "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "42"},
    ]
    text, _ = chat_text(api, history, 12, tools=[CHAT_MULTIPLY], tool_choice="none")
    assert second.output_text == text and chained.output_text == text and text


def test_a_named_tool_choice(api):
    response = api.responses.create(
        model=MODEL,
        input=QUESTION,
        tools=[MULTIPLY],
        tool_choice={"type": "function", "name": "multiply"},
        max_output_tokens=30,
    )
    (call,) = response.output
    assert call.name == "multiply" and set(json.loads(call.arguments)) == {"a", "b"}


def test_text_format_json_schema_and_parse(api):
    from typing import Literal

    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=16)
        big: Literal["yes", "no"]

    parsed = api.responses.parse(
        model=MODEL, input="Describe a big city as JSON.", text_format=City, max_output_tokens=60
    )
    assert isinstance(parsed.output_parsed, City) and parsed.status == "completed"
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    response = api.responses.create(
        model=MODEL,
        input="Is the sky blue?",
        max_output_tokens=20,
        text={"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text)["answer"] in ("yes", "no")
    assert response.text.format.type == "json_schema"
    loose = api.responses.create(
        model=MODEL, input="Give me JSON.", max_output_tokens=30, text={"format": {"type": "json_object"}}
    )
    free = api.responses.create(model=MODEL, input="Give me JSON.", max_output_tokens=30)
    assert loose.output_text.startswith("{") and not free.output_text.startswith("{")  # cut, it need not parse yet


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        blocks = response.read().decode().strip().split("\n\n")
    events = []
    for block in blocks:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        events.append((name[len("event: ") :], json.loads(data[len("data: ") :])))
    return events


TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_a_stream_sends_typed_events_in_order_that_make_the_whole_answer(server, api):
    body = {"model": MODEL, "input": "Tell me about the sea.", "max_output_tokens": 16}
    events = raw_events(server, body)
    whole = api.responses.create(**body)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    deduplicated = [n for i, n in enumerate(names) if i == 0 or n != names[i - 1]]
    assert deduplicated == TEXT_EVENTS + ["response.incomplete"] and names.count("response.output_text.delta") > 1
    deltas = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert deltas == whole.output_text and final["output"][0]["content"][0]["text"] == deltas
    assert events[0][1]["response"]["id"] == final["id"] and final["status"] == "incomplete"
    assert {data["item_id"] for name, data in events if "item_id" in data} == {final["output"][0]["id"]}
    with api.responses.stream(model=MODEL, input="What is 2+2?", max_output_tokens=40) as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        completed = stream.get_final_response()  # the client's accumulator takes the events
    assert completed.status == "completed" and completed.output_text == text


def test_a_streamed_tool_call(server, api):
    body = {
        "model": MODEL,
        "input": QUESTION,
        "tools": [MULTIPLY],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": 40,
    }
    events = raw_events(server, body)
    names = [name for name, _ in events]
    deltas = [e for name, e in events if name == "response.function_call_arguments.delta"]
    assert names == ["response.created", "response.in_progress", "response.output_item.added"] + [
        "response.function_call_arguments.delta"
    ] * len(deltas) + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert len(deltas) > 2  # the arguments in fragments as they are committed, as chat streams them
    whole = api.responses.create(**body)
    done = events[-2][1]["item"]
    assert done["type"] == "function_call" and done["arguments"] == whole.output[0].arguments
    assert "".join(e["delta"] for e in deltas) == done["arguments"] and events[-1][1]["response"]["output"] == [done]


def cancelled(client: httpx.Client) -> float:
    line = next(
        line
        for line in client.get("/metrics").text.splitlines()
        if line.startswith('jacobi_rt_generations_total{outcome="cancelled"}')
    )
    return float(line.rsplit(" ", 1)[1])


def test_a_streamed_response_whose_client_leaves_stops(server):
    counting = {"model": MODEL, "input": "Count from 1 to 500: 1, 2, 3,", "max_output_tokens": 500, "stream": True}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        before = cancelled(c)
        with c.stream("POST", "/v1/responses", json=counting) as response:
            lines = response.iter_lines()
            assert [next(lines) for _ in range(6)][0] == "event: response.created"  # created, in_progress, the item
        deadline = time.monotonic() + 20
        while cancelled(c) == before or c.get("/health").json()["running"]:
            assert time.monotonic() < deadline, "the generation did not stop"
            time.sleep(0.05)


def test_previous_response_id_continues_the_conversation(api):
    first = api.responses.create(model=MODEL, input="My name is Ada.", instructions="Be brief.", max_output_tokens=10)
    second = api.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=10
    )
    messages = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]  # instructions are not carried over (as OpenAI does)
    text, chat = chat_text(api, messages, 10)
    assert second.output_text == text and second.previous_response_id == first.id
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    unstored = api.responses.create(model=MODEL, input="Hi", store=False, max_output_tokens=2)
    for missing in (unstored.id, "resp_nothing"):
        with pytest.raises(openai.BadRequestError, match="no stored response has the id") as caught:
            api.responses.create(model=MODEL, input="Hi", previous_response_id=missing, max_output_tokens=2)
        assert caught.value.param == "previous_response_id" and caught.value.code == "previous_response_not_found"


REFUSED = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools.0.type"),
    ({"tool_choice": {"type": "web_search_preview"}, "tools": [MULTIPLY]}, "tool_choice.type"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"max_tool_calls": 2}, "max_tool_calls"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"context_management": [{"type": "compaction"}]}, "context_management"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"max_tokens": 5}, "max_tokens"),
    ({"logit_bias": {"19556": -100}}, "logit_bias"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"tools": [{**MULTIPLY, "parameters": "not a schema"}]}, "tools.0.parameters"),
    ({"tools": [MULTIPLY], "tool_choice": {"type": "function", "name": "divide"}}, "tool_choice.name"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
        "input.0.content.0.type",
    ),
    ({"input": [{"role": "user", "content": []}]}, "input.0.content"),
    ({"input": [{"role": "tool", "content": "4"}]}, "input.0.role"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "4"}]}, "input.0.call_id"),
    ({"input": "Hi", "instructions": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ({"input": None}, "input"),
]


@pytest.mark.parametrize("fields, param", REFUSED, ids=[param + f"-{i}" for i, (_, param) in enumerate(REFUSED)])
def test_what_is_not_served_is_a_400_naming_the_field(server, fields, param):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **fields}
    reply = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"], error
    assert re.search(r"\bmessages\.\d|response_format|\.function\.", error["message"]) is None, (
        error
    )  # Responses names only


def test_the_openapi_document_has_the_request_model_and_the_metrics_count_the_route(server):
    document = httpx.get(server.url + "/openapi.json", timeout=30).json()
    ref = document["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"input", "instructions", "tools", "text", "previous_response_id", "max_output_tokens"} <= set(
        schema["properties"]
    )
    assert "$defs" not in json.dumps(schema)  # its references would not resolve inside the OpenAPI document
    for body in ({"input": "Hi", "max_output_tokens": 1}, {"input": "Hi", "background": True}):
        httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'jacobi_rt_requests_total{code="200",endpoint="responses"}' in metrics
    assert 'jacobi_rt_requests_total{code="400",endpoint="responses"}' in metrics


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(max_responses=2, max_chars=200)
    store.put("a", [{"role": "user", "content": "1"}])
    store.put("b", [{"role": "user", "content": "2"}])
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", [{"role": "user", "content": "3"}])
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    store.put("d", [{"role": "user", "content": "x" * 150}])  # over the characters left: the oldest go
    assert store.get("a") is None and store.get("d") and len(store) <= 2
    store.put("e", [{"role": "user", "content": "x" * 300}])  # larger than the whole store: not kept
    assert store.get("e") is None


FIXTURE = Path(__file__).parent / "fixtures" / "openai_agents_responses.json"


def test_the_openai_agents_sdk_bodies(server):
    """The bodies the openai-agents SDK's default model sent for a function tool (recorded once, see the fixture)."""
    recorded = json.loads(FIXTURE.read_text())
    first = httpx.post(server.url + "/v1/responses", json=recorded["first_turn"], timeout=120).json()
    (call,) = first["output"]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"a": 6, "b": 7}
    events = raw_events(server, recorded["first_turn_streamed"])
    assert (
        events[-1][0] == "response.completed"
        and events[-1][1]["response"]["output"][0]["arguments"] == call["arguments"]
    )
    # the second turn names no tool_choice ("auto"): on SmolLM2's template it is served by the generic protocol
    second = httpx.post(server.url + "/v1/responses", json=recorded["second_turn"], timeout=120)
    assert second.status_code == 200, second.text
    assert second.json()["output"][0]["type"] in ("message", "function_call")
    answered = httpx.post(
        server.url + "/v1/responses", json={**recorded["second_turn"], "tool_choice": "none"}, timeout=120
    )
    assert answered.status_code == 200 and answered.json()["output"][0]["type"] == "message"


def test_tool_call_deltas_stream_as_the_chat_chunks_bring_them():
    """Chat chunks that stream a call's arguments piece by piece (as OpenAI streams them) become the Responses
    deltas one for one; the finished Response keeps the call id the stream announced (and stores it)."""
    from jacobi_rt.server.responses import ResponseEvents, parse_response

    store = ResponseStore()
    turn = parse_response(
        {"input": QUESTION, "tools": [MULTIPLY], "tool_choice": "required", "stream": True}, store, MODEL
    )
    events = ResponseEvents(turn)
    deltas = [
        {
            "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 6'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ', "b": 7}'}}]},
        {},
    ]
    written = [event for delta in deltas for event in events.chunk({"choices": [{"index": 0, "delta": delta}]})]
    whole = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_other",
                            "type": "function",
                            "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
                        }
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 5,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "jacobi": {},
    }
    written += events.closing(whole)
    parsed = [json.loads(event.decode().split("data: ", 1)[1]) for event in written]
    assert [e["type"] for e in parsed] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in parsed if e["type"].endswith(".delta")] == ['{"a": 6', ', "b": 7}']
    assert parsed[-1]["response"]["output"][0]["call_id"] == "call_1" == parsed[-2]["item"]["call_id"]
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in parsed[:-1]} == {"fc_1"}
    assert store.get(turn.id)[-1]["tool_calls"][0]["id"] == "call_1"


# a template that renders the tools and the tool history itself (Qwen2.5's layout, cut short for the tiny
# qwen2 artifact's 256-token context), so tool_choice "auto" is served
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>
Calls: <tool_call>{"name", "arguments"}</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": \
{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% elif m['role'] == 'tool' %}\
<tool_response>{{ m['content'] }}</tool_response>{% else %}{{ m['content'] }}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def tools_server(artifact, tmp_path_factory):
    from templated import template_server

    with template_server(artifact("qwen2"), tmp_path_factory.mktemp("qwen2-responses"), TOOLS_TEMPLATE) as served:
        yield served


def test_auto_and_the_tool_history_on_a_template_that_renders_them(tools_server):
    """The items of a tool round trip with tool_choice left out ("auto", as the openai-agents SDK sends its second
    turn) reach the template as chat's tool history: the same prompt and answer as the chat endpoint's."""
    server, gen = tools_server
    weather = {"type": "function", "name": "w", "parameters": {}}
    items = [
        {"role": "user", "content": "Hi"},
        {"type": "function_call", "call_id": "call_7", "name": "w", "arguments": "{}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_7", "output": "4"},
    ]
    messages = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "4"},
    ]
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as api:
        response = api.responses.create(model="qwen2", input=items, tools=[weather], max_output_tokens=8)
        chat = api.chat.completions.create(
            model="qwen2",
            messages=messages,
            max_tokens=8,
            tools=[{"type": "function", "function": {"name": "w", "parameters": weather["parameters"]}}],
        )
    as_templates_read_it = [
        messages[0],
        {
            **messages[1],
            "content": "",
            "tool_calls": [  # arguments: the JSON object
                {**messages[1]["tool_calls"][0], "function": {"name": "w", "arguments": {}}}
            ],
        },
        {**messages[2], "name": "w"},
    ]
    rendered = gen.tokenizer.render_chat(
        as_templates_read_it,
        add_generation_prompt=True,
        tools=[{"type": "function", "function": {"name": "w", "parameters": weather["parameters"]}}],
    )
    assert (
        '<tool_call>{"name": "w", "arguments": {}}</tool_call>' in rendered
        and "<tool_response>4</tool_response>" in rendered
    )
    assert "<tools>" in rendered
    assert (
        response.usage.input_tokens
        == chat.usage.prompt_tokens
        == len(gen.tokenizer.encode(rendered, add_special_tokens=False))
    )
    assert [item.type for item in response.output] == (["message"] if chat.choices[0].message.content else []) + [
        "function_call"
    ] * len(chat.choices[0].message.tool_calls or [])
    assert response.output_text == (chat.choices[0].message.content or "")


def test_a_stored_response_can_be_read_back_and_deleted(server, api):
    made = api.responses.create(model=MODEL, input="Say hi.", max_output_tokens=6)
    read = api.responses.retrieve(made.id)
    assert (
        read.id == made.id
        and read.output_text == made.output_text
        and read.usage.output_tokens == made.usage.output_tokens
    )
    deleted = httpx.delete(server.url + f"/v1/responses/{made.id}", timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"id": made.id, "object": "response", "deleted": True}
    for reply in (
        httpx.get(server.url + f"/v1/responses/{made.id}", timeout=30),
        httpx.delete(server.url + f"/v1/responses/{made.id}", timeout=30),
    ):
        assert reply.status_code == 404 and reply.json()["error"]["param"] == "response_id", reply.text
    again = httpx.post(
        server.url + "/v1/responses", json={"input": "And?", "previous_response_id": made.id}, timeout=60
    )
    assert again.status_code == 400 and again.json()["error"]["code"] == "previous_response_not_found"
    unstored = api.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2, store=False)
    assert httpx.get(server.url + f"/v1/responses/{unstored.id}", timeout=30).status_code == 404
