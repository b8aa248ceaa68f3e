"""The request bodies LangChain, pydantic-ai and the openai-agents SDK really sent (recorded once by
benchmarks/agent_frameworks.py --record; versions in the fixture), replayed over real HTTP on SmolLM2-135M:
200s, tool-call arguments valid against the tool's parameters, and each turn of the agent loop answered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (the dev extra)")
pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")
jsonschema = pytest.importorskip("jsonschema", reason="the argument checks need jsonschema (the dev extra)")

from jacobi_rt.server.run import BackgroundServer  # noqa: E402
from jacobi_rt.server.settings import ServerSettings  # noqa: E402

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "agent_frameworks.json").read_text())


@pytest.fixture(scope="module")
def smollm2(generator):
    """`jacobi-rt serve` on SmolLM2-135M with its defaults, on the session's Generator."""
    with BackgroundServer(generator("smollm2-135m"), ServerSettings(model_id="smollm2-135m")) as server:
        yield server


def replay(server, mode: str, turn: int) -> dict:
    request = RECORDED["modes"][mode][turn]
    reply = httpx.post(server.url + request["path"], json=request["body"], timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def parameters(body: dict, name: str) -> dict:
    (tool,) = [t["function"] for t in body["tools"] if t["function"]["name"] == name]
    return tool["parameters"]


def valid_calls(mode: str, turn: int, reply: dict) -> list[dict]:
    """The reply's tool calls, each's arguments valid against the tool the request offered."""
    body = RECORDED["modes"][mode][turn]["body"]
    calls = reply["choices"][0]["message"]["tool_calls"]
    assert calls and reply["choices"][0]["finish_reason"] != "length"
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), parameters(body, call["function"]["name"]))
    return calls


def test_langchain_bind_tools_any_then_the_answer(smollm2):
    """bind_tools(tool_choice="any") (sent as "required"), then the tool's result with the tools offered again."""
    valid_calls("langchain-openai bind_tools any", 0, replay(smollm2, "langchain-openai bind_tools any", 0))
    answer = replay(smollm2, "langchain-openai bind_tools any", 1)["choices"][0]["message"]
    assert answer["content"] and not answer.get("tool_calls")


def test_langchain_bind_tools_named_sees_the_tool_it_must_call(smollm2):
    """A named tool_choice on SmolLM2's template (which renders no tools): the tools listed in the system
    message; without them the model wrote {"a": 10, "b": 7} for "a=6 and b=7", then called again and again."""
    mode = "langchain-openai bind_tools named"
    (call,) = valid_calls(mode, 0, replay(smollm2, mode, 0))
    assert json.loads(call["function"]["arguments"]) == {"a": 6, "b": 7}


def test_langchain_structured_output_by_function_calling_ends_its_call(smollm2):
    """with_structured_output(method="function_calling"): a named tool whose parameters say nothing of other
    properties; SmolLM2 wrote made-up ones until max_tokens cut the call (LangChain then returned None)."""
    mode = "langchain-openai structured function_calling"
    (call,) = valid_calls(mode, 0, replay(smollm2, mode, 0))
    assert set(json.loads(call["function"]["arguments"])) == {"name", "born", "address"}


def test_pydantic_ai_output_tool_with_defs(smollm2):
    """pydantic-ai's output tool for a model with a nested one: parameters with $defs and a $ref under
    tool_choice "required" (a 400, "Pointer '/$defs/Address' does not exist", before server/call_schema.py)."""
    mode = "pydantic-ai-slim[openai] output ToolOutput"
    assert "$defs" in json.dumps(RECORDED["modes"][mode][0]["body"]["tools"])
    valid_calls(mode, 0, replay(smollm2, mode, 0))


def test_openai_agents_chat_completions_tool_loop(smollm2):
    """The openai-agents SDK on OpenAIChatCompletionsModel with tool_choice "required": the call, then (the SDK
    resets tool_choice) the answer; SmolLM2 repeated the call until max_turns before the generic rendering of
    tool results asked for the answer."""
    mode = "openai-agents ChatCompletions tool_choice required"
    valid_calls(mode, 0, replay(smollm2, mode, 0))
    answer = replay(smollm2, mode, 1)["choices"][0]["message"]
    assert answer["content"] and not answer.get("tool_calls")


def test_openai_agents_output_type_with_defs(smollm2):
    """output_type=Person: a strict json_schema response_format with $defs; the content is a valid Person."""
    mode = "openai-agents ChatCompletions output_type"
    schema = RECORDED["modes"][mode][0]["body"]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(replay(smollm2, mode, 0)["choices"][0]["message"]["content"]), schema)


AUTO_CHAT = [
    "langchain-openai bind_tools (auto)",
    "pydantic-ai-slim[openai] tools (auto)",
    "openai-agents ChatCompletions tools (auto)",
]


@pytest.mark.parametrize("mode", AUTO_CHAT)
def test_the_default_tool_choice_calls_then_answers(smollm2, mode):
    """Each framework's default ("auto") on a template that renders no tools: the generic protocol's json form
    calls multiply(6, 7) (SmolLM2 wrote a Python code block instead before it), its text form answers with the
    result the tool message brought back."""
    (call,) = valid_calls(mode, 0, replay(smollm2, mode, 0))
    assert call["function"]["name"] == "multiply" and json.loads(call["function"]["arguments"]) == {"a": 6, "b": 7}
    answer = replay(smollm2, mode, 1)["choices"][0]["message"]
    assert "42" in answer["content"] and not answer.get("tool_calls")


def test_the_responses_models_default_tool_choice_calls_then_answers(smollm2):
    """The openai-agents SDK's default model (the Responses API) with a function tool: a function_call item,
    then, after its function_call_output, a message."""
    mode = "openai-agents Responses tools (auto)"
    (call,) = [item for item in replay(smollm2, mode, 0)["output"] if item["type"] == "function_call"]
    (tool,) = RECORDED["modes"][mode][0]["body"]["tools"]
    assert call["name"] == "multiply" and json.loads(call["arguments"]) == {"a": 6, "b": 7}
    jsonschema.validate(json.loads(call["arguments"]), tool["parameters"])
    output = replay(smollm2, mode, 1)["output"]
    assert [item["type"] for item in output] == ["message"]
    assert "42" in output[0]["content"][0]["text"]
