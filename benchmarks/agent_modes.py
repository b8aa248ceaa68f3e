"""The agent-framework modes benchmarks/agent_frameworks.py measures: LangChain, pydantic-ai, the openai-agents SDK.

Each mode is one function `mode(target) -> detail` that drives the framework against an OpenAI-compatible
server and raises `ModeFailed` (or the framework's own error) where the mode does not work: plain chat,
streaming, the two-turn tool loop (call `multiply`, get 42 back, answer) with the default tool_choice,
tool_choice required and named, and structured output. The frameworks are imported inside the modes, so
this module imports without them. Every request a mode sends is kept in `target.sent` (to record fixtures).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

CALL = "Call multiply with a=6 and b=7, then tell me the result."
CHAT = "Say hello in one short sentence."
PERSON = "Give me a person: Ada Lovelace, born 1815, who lives in London, UK."
MAX_TOKENS = 96
MAX_TURNS = 4  # tool loops: call, result, answer, and one spare


class ModeFailed(Exception):
    """The framework ran but the mode did not do its job (no call, invalid arguments, no answer)."""


@dataclass
class Target:
    """One server under test: its base URL (ending in /v1), its model id, and the requests sent to it."""

    base_url: str
    model: str
    sent: list[dict] = field(default_factory=list)

    def _keep(self, request) -> None:
        body = json.loads(request.content) if request.content else None
        self.sent.append({"method": request.method, "path": request.url.path, "body": body})

    def http_client(self):
        import httpx

        return httpx.Client(timeout=300, event_hooks={"request": [self._keep]})

    def async_http_client(self):
        import httpx

        async def keep(request):
            self._keep(request)

        return httpx.AsyncClient(timeout=300, event_hooks={"request": [keep]})

    def async_openai(self):
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, http_client=self.async_http_client()
        )


@dataclass(frozen=True)
class Mode:
    framework: str  # the pip package that provides it
    name: str
    run: Callable[[Target], str]


def multiply_tool(seen: list[tuple[int, int]]) -> Callable[[int, int], int]:
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        if not (isinstance(a, int) and isinstance(b, int)):
            raise ModeFailed(f"multiply got {a!r}, {b!r}: not integers")
        seen.append((a, b))
        return a * b

    return multiply


def person_model():
    """A pydantic model with a nested one, so its JSON schema has $defs (as real agents' schemas do)."""
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        country: str

    class Person(BaseModel):
        name: str
        born: int
        address: Address

    return Person


def _called(seen: list, answer: str) -> str:
    if not seen:
        raise ModeFailed(f"answered without calling the tool: {answer[:60]!r}")
    if not answer.strip():
        raise ModeFailed(f"called multiply{seen[0]} but gave no answer")
    return f"multiply{seen[0]} -> {answer.strip()[:40]!r}"


# -- LangChain (langchain-openai) --------------------------------------------------------------------


def _chat_openai(target: Target):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=target.model,
        base_url=target.base_url,
        api_key="unused",
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        http_client=target.http_client(),
    )


def lc_chat(target: Target) -> str:
    text = _chat_openai(target).invoke(CHAT).content
    if not text:
        raise ModeFailed("empty content")
    return repr(text[:40])


def lc_stream(target: Target) -> str:
    pieces = [chunk.content for chunk in _chat_openai(target).stream(CHAT)]
    if not "".join(pieces):
        raise ModeFailed("empty stream")
    return f"{len(pieces)} chunks"


def lc_tools(tool_choice: str | None) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        from langchain_core.messages import HumanMessage, ToolMessage

        seen: list = []
        multiply = multiply_tool(seen)
        llm = _chat_openai(target)
        bound = (
            llm.bind_tools([multiply]) if tool_choice is None else llm.bind_tools([multiply], tool_choice=tool_choice)
        )
        messages = [HumanMessage(CALL)]
        reply = bound.invoke(messages)
        if reply.invalid_tool_calls:
            raise ModeFailed(f"invalid tool call: {reply.invalid_tool_calls[0]}")
        if not reply.tool_calls:
            raise ModeFailed(f"no tool call; content {reply.content[:60]!r}")
        messages.append(reply)
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(multiply(**call["args"])), tool_call_id=call["id"]))
        answer = llm.bind_tools([multiply]).invoke(messages)  # the answer turn: tools offered, auto
        if answer.tool_calls:
            raise ModeFailed(f"multiply{seen[0]}, then called it again instead of answering")
        return _called(seen, answer.content)

    return run


def lc_stream_tools(target: Target) -> str:
    """bind_tools(tool_choice="any"), streamed: the chunks joined carry the call."""
    seen: list = []
    multiply = multiply_tool(seen)
    chunks = list(_chat_openai(target).bind_tools([multiply], tool_choice="any").stream(CALL))
    joined = chunks[0]
    for chunk in chunks[1:]:
        joined = joined + chunk
    if not joined.tool_calls:
        raise ModeFailed(f"no tool call in {len(chunks)} chunks; content {joined.content[:60]!r}")
    multiply(**joined.tool_calls[0]["args"])
    return f"{len(chunks)} chunks, multiply{seen[0]}"


def lc_structured(method: str) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        person = _chat_openai(target).with_structured_output(person_model(), method=method)
        prompt = PERSON + (
            " Answer in JSON with keys name, born, address (city, country)." if method == "json_mode" else ""
        )
        got = person.invoke(prompt)
        if got is None:  # LangChain's parser found no (valid) tool call
            raise ModeFailed("with_structured_output returned None")
        return repr(got)[:60]

    return run


# -- pydantic-ai (pydantic-ai-slim[openai]) ----------------------------------------------------------


def _pai_model(target: Target, client):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(target.model, provider=OpenAIProvider(openai_client=client))


def _pai_settings():
    return {"temperature": 0.0, "max_tokens": MAX_TOKENS}


def pai_chat(target: Target) -> str:
    from pydantic_ai import Agent

    async def go():
        agent = Agent(_pai_model(target, target.async_openai()), model_settings=_pai_settings())
        return (await agent.run(CHAT)).output

    return repr(asyncio.run(go())[:40])


def pai_stream(target: Target) -> str:
    from pydantic_ai import Agent

    async def go():
        agent = Agent(_pai_model(target, target.async_openai()), model_settings=_pai_settings())
        async with agent.run_stream(CHAT) as run:
            return [piece async for piece in run.stream_text(delta=True)]

    pieces = asyncio.run(go())
    if not "".join(pieces):
        raise ModeFailed("empty stream")
    return f"{len(pieces)} chunks"


def pai_tools(target: Target) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.usage import UsageLimits

    seen: list = []

    async def go():
        agent = Agent(
            _pai_model(target, target.async_openai()), tools=[multiply_tool(seen)], model_settings=_pai_settings()
        )
        return (await agent.run(CALL, usage_limits=UsageLimits(request_limit=MAX_TURNS))).output

    return _called(seen, asyncio.run(go()))


def pai_output(kind: str) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        import pydantic_ai
        from pydantic_ai import Agent
        from pydantic_ai.usage import UsageLimits

        person = person_model()
        output = person if kind == "ToolOutput" else getattr(pydantic_ai, kind)(person)

        async def go():
            agent = Agent(_pai_model(target, target.async_openai()), output_type=output, model_settings=_pai_settings())
            return (await agent.run(PERSON, usage_limits=UsageLimits(request_limit=MAX_TURNS))).output

        return repr(asyncio.run(go()))[:60]

    return run


# -- the openai-agents SDK (openai-agents) -----------------------------------------------------------


def _sdk_model(target: Target, client, responses: bool):
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)  # no trace export to OpenAI
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    return kind(model=target.model, openai_client=client)


def _sdk_agent(target: Target, responses: bool, **fields):
    from agents import Agent, ModelSettings

    settings = ModelSettings(temperature=0, max_tokens=MAX_TOKENS, tool_choice=fields.pop("tool_choice", None))
    return Agent(
        name="assistant",
        instructions="You are a helpful assistant.",
        model=_sdk_model(target, target.async_openai(), responses),
        model_settings=settings,
        **fields,
    )


def sdk_chat(responses: bool) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        from agents import Runner

        async def go():
            return (await Runner.run(_sdk_agent(target, responses), CHAT, max_turns=MAX_TURNS)).final_output

        return repr(asyncio.run(go())[:40])

    return run


def sdk_stream(responses: bool) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        from agents import Runner

        async def go():
            result = Runner.run_streamed(_sdk_agent(target, responses), CHAT, max_turns=MAX_TURNS)
            events = [event async for event in result.stream_events() if event.type == "raw_response_event"]
            return events, result.final_output

        events, text = asyncio.run(go())
        if not text:
            raise ModeFailed("empty final output")
        return f"{len(events)} events"

    return run


def sdk_tools(responses: bool, tool_choice: str | None) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        from agents import Runner, function_tool

        seen: list = []

        async def go():
            agent = _sdk_agent(target, responses, tools=[function_tool(multiply_tool(seen))], tool_choice=tool_choice)
            return (await Runner.run(agent, CALL, max_turns=MAX_TURNS)).final_output

        return _called(seen, str(asyncio.run(go())))

    return run


def sdk_stream_tools(responses: bool) -> Callable[[Target], str]:
    """The tool loop with tool_choice "required" under Runner.run_streamed."""

    def run(target: Target) -> str:
        from agents import Runner, function_tool

        seen: list = []

        async def go():
            agent = _sdk_agent(target, responses, tools=[function_tool(multiply_tool(seen))], tool_choice="required")
            result = Runner.run_streamed(agent, CALL, max_turns=MAX_TURNS)
            async for _ in result.stream_events():
                pass
            return result.final_output

        return _called(seen, str(asyncio.run(go())))

    return run


def sdk_output(responses: bool) -> Callable[[Target], str]:
    def run(target: Target) -> str:
        from agents import Runner

        async def go():
            agent = _sdk_agent(target, responses, output_type=person_model())
            return (await Runner.run(agent, PERSON, max_turns=MAX_TURNS)).final_output

        return repr(asyncio.run(go()))[:60]

    return run


def _sdk_modes(label: str, responses: bool) -> list[Mode]:
    package = "openai-agents"
    return [
        Mode(package, f"{label} chat", sdk_chat(responses)),
        Mode(package, f"{label} stream", sdk_stream(responses)),
        Mode(package, f"{label} tools (auto)", sdk_tools(responses, None)),
        Mode(package, f"{label} tool_choice required", sdk_tools(responses, "required")),
        Mode(package, f"{label} tool_choice named", sdk_tools(responses, "multiply")),
        Mode(package, f"{label} stream, tool_choice required", sdk_stream_tools(responses)),
        Mode(package, f"{label} output_type", sdk_output(responses)),
    ]


MODES: list[Mode] = [
    Mode("langchain-openai", "chat", lc_chat),
    Mode("langchain-openai", "stream", lc_stream),
    Mode("langchain-openai", "bind_tools (auto)", lc_tools(None)),
    Mode("langchain-openai", "bind_tools any", lc_tools("any")),
    Mode("langchain-openai", "bind_tools named", lc_tools("multiply")),
    Mode("langchain-openai", "stream, bind_tools any", lc_stream_tools),
    Mode("langchain-openai", "structured json_schema", lc_structured("json_schema")),
    Mode("langchain-openai", "structured function_calling", lc_structured("function_calling")),
    Mode("langchain-openai", "structured json_mode", lc_structured("json_mode")),
    Mode("pydantic-ai-slim[openai]", "chat", pai_chat),
    Mode("pydantic-ai-slim[openai]", "stream", pai_stream),
    Mode("pydantic-ai-slim[openai]", "tools (auto)", pai_tools),
    Mode("pydantic-ai-slim[openai]", "output ToolOutput", pai_output("ToolOutput")),
    Mode("pydantic-ai-slim[openai]", "output NativeOutput", pai_output("NativeOutput")),
    Mode("pydantic-ai-slim[openai]", "output PromptedOutput", pai_output("PromptedOutput")),
    *_sdk_modes("Responses", True),
    *_sdk_modes("ChatCompletions", False),
]
