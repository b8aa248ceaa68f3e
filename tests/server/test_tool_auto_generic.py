"""tool_choice "auto" by the generic protocol (server/tool_protocol.py) over real HTTP on SmolLM2-135M, whose
chat template renders no tools: a call of an offered function with valid arguments, or content; a two-turn
round trip with the official client; streamed deltas that join to the whole reply, logprobs per chunk; and
the same output under every strategy, equal to greedy decoding of the same constrained request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the client tests need the openai package (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")
jsonschema = pytest.importorskip("jsonschema", reason="the argument checks need jsonschema (the dev extra)")

from jacobi_rt.runtime import Generator  # noqa: E402
from jacobi_rt.runtime.constraints import Constraint  # noqa: E402
from jacobi_rt.runtime.errors import ArtifactError  # noqa: E402
from jacobi_rt.runtime.manifest import load_manifest  # noqa: E402
from jacobi_rt.runtime.params import GenerationParams  # noqa: E402
from jacobi_rt.server.run import BackgroundServer  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402
from jacobi_rt.server.tool_calls import ToolCalls  # noqa: E402
from jacobi_rt.server.tool_protocol import described, generic_form, grammar  # noqa: E402

MODEL = "smollm2-135m"
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
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string"}},
        },
    },
}
TOOLS = [WEATHER, MULTIPLY]
CALLS = [{"role": "user", "content": "Call multiply with a=6 and b=7."}]  # SmolLM2 calls here (greedy)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]  # and answers here ("Hi!": a call)
STRATEGIES = ["greedy", "jacobi", "lookahead", "speculative", "auto"]


def _draft() -> Path | None:
    folder = Path(os.environ.get("JACOBI_RT_TEST_ARTIFACTS", "build")) / "smollm2-135m-draft6"
    try:
        load_manifest(folder, verify=False)
    except ArtifactError:
        return None
    return folder


@pytest.fixture(scope="module")
def served(artifact):
    """SmolLM2 with its draft where the prebuilt one exists (speculative is tested only then)."""
    draft = _draft()
    gen = Generator.load(artifact(MODEL), draft=draft, graph="inplace")
    with BackgroundServer(gen, ServerSettings(model_id=MODEL)) as server:
        yield server, gen


@pytest.fixture
def api(served):
    with openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


def valid_call(call) -> dict:
    """The call's arguments, checked against its function's schema (a call of an unoffered function fails)."""
    (tool,) = [t for t in TOOLS if t["function"]["name"] == call.function.name]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    assert call.id.startswith("call_") and call.type == "function"
    return arguments


def test_models_says_generic(api):
    assert api.models.list().data[0].model_extra["jacobi"]["tools"] == "generic"


def test_auto_is_a_call_of_an_offered_function_or_content(api):
    called = api.chat.completions.create(model=MODEL, messages=CALLS, tools=TOOLS, max_tokens=40)
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "multiply" and valid_call(call) == {"a": 6, "b": 7}
    answered = api.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, max_tokens=40)
    choice = answered.choices[0]
    assert not choice.message.tool_calls and choice.message.content and choice.message.content[0] not in "{[ "
    plain = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40)
    assert answered.usage.prompt_tokens > plain.usage.prompt_tokens + 100  # the tools described in a system message


def test_a_two_turn_round_trip_with_the_official_client(api):
    """Call, tool result, answer, each turn tool_choice "auto" (the default with tools), as agents send it."""
    first = api.chat.completions.create(model=MODEL, messages=CALLS, tools=TOOLS, max_tokens=40)
    (call,) = first.choices[0].message.tool_calls
    history = CALLS + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=40)
    message = second.choices[0].message
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt
    assert message.content or message.tool_calls
    for later in message.tool_calls or ():
        valid_call(later)
    if message.content:
        assert message.content[0] not in "{["


def joined(chunks) -> tuple[str | None, list[tuple[str, str]], list, str]:
    """(content, [(name, arguments)], logprob tokens, finish_reason) of a stream, checking each call's first delta."""
    content, calls, logprobs, finish = None, {}, [], None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        assert delta.content or delta.tool_calls or delta.role or choice.finish_reason  # no empty delta: {}
        if delta.content:
            content = (content or "") + delta.content
        for entry in delta.tool_calls or ():
            if entry.index not in calls:
                assert entry.id.startswith("call_") and entry.type == "function" and entry.function.arguments == ""
                calls[entry.index] = [entry.function.name, ""]
            else:
                assert entry.id is None and entry.function.name is None
                calls[entry.index][1] += entry.function.arguments
        if choice.logprobs and choice.logprobs.content:
            logprobs += [(lp.token, lp.logprob) for lp in choice.logprobs.content]
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], logprobs, finish


@pytest.mark.parametrize(
    "messages, tool_choice",
    [
        (CALLS, "auto"),
        (CHAT, "auto"),
        (CALLS, "required"),
        (CALLS, {"type": "function", "function": {"name": "multiply"}}),
    ],
    ids=["auto-call", "auto-answer", "required", "named"],
)
def test_streamed_deltas_join_to_the_whole_reply(api, messages, tool_choice):
    body = dict(model=MODEL, messages=messages, tools=TOOLS, tool_choice=tool_choice, max_tokens=40, logprobs=True)
    whole = api.chat.completions.create(**body).choices[0]
    chunks = list(api.chat.completions.create(**body, stream=True))
    content, calls, logprobs, finish = joined(chunks)
    assert content == whole.message.content and finish == whole.finish_reason
    assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or ()]
    expected = [(lp.token, lp.logprob) for lp in whole.logprobs.content]
    assert [t for t, _ in logprobs] == [t for t, _ in expected]  # values to float rounding: the prefix cache's
    assert [v for _, v in logprobs] == pytest.approx([v for _, v in expected], abs=1e-4)  # KV sums in another order
    carrying = [c for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content]
    assert len(carrying) > 2  # per chunk as committed, not all in the closing chunk
    deltas = sum(1 for c in chunks if c.choices and (c.choices[0].delta.content or c.choices[0].delta.tool_calls))
    assert deltas > 3  # streamed as written, not whole at the end


def test_a_call_cut_by_max_tokens_streams_as_far_as_written(api):
    body = dict(model=MODEL, messages=CALLS, tools=TOOLS, max_tokens=12)
    whole = api.chat.completions.create(**body).choices[0]
    content, calls, _, finish = joined(api.chat.completions.create(**body, stream=True))
    assert whole.finish_reason == finish == "length" and content is None is whole.message.content
    assert (
        calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        and calls[0][0] == "multiply"
    )


@pytest.mark.parametrize("messages", [CALLS, CHAT], ids=["call", "answer"])
def test_every_strategy_gives_greedys_output(api, served, messages):
    """The same reply under every strategy, equal to greedy decoding of the same constrained request."""
    _, gen = served
    strategies = [s for s in STRATEGIES if s != "speculative" or gen.draft is not None]
    replies = {
        s: api.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, max_tokens=40, extra_body={"jacobi": {"strategy": s}}
        )
        for s in strategies
    }
    functions = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    form = generic_form(messages)
    expected = gen.generate(
        messages=described(messages, [t["function"] for t in TOOLS], True, form),
        max_new_tokens=40,
        params=GenerationParams(constraint=Constraint.lark(grammar(functions, True, form))),
        strategy="greedy",
    )
    content, calls = ToolCalls(None, names=tuple(functions), generic=form).message(expected.text, cut=False)
    for strategy, reply in replies.items():
        message = reply.choices[0].message
        assert reply.model_extra["jacobi"]["strategy"] == strategy
        assert reply.usage.completion_tokens == expected.stats.new_tokens, strategy
        assert message.content == content, strategy
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls or ()] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls or ()
        ], strategy
    if gen.draft is None:
        pytest.skip("speculative untested: no smollm2-135m-draft6 artifact (the others were)")
