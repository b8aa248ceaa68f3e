"""Request bodies: the OpenAI fields jacobi-rt reads, checked with pydantic, turned into a GenerationCall.

Nothing that would change the output is silently ignored: a declared field jacobi-rt cannot honour
yet (logit_bias, best_of, echo, suffix) is refused with a 400 that says so, and so is any field the
models below do not declare (guided_json, grammar, functions ...), naming the field. The fields that
constrain the output (response_format, structured_outputs, tools with tool_choice) are parsed into
`GenerationCall.params.constraint` (and `tools`, how a reply presents a tool call) by server/structured.py;
the app parses with `allow_constraints=True` (False refuses them, as a server that cannot honour them
must). Only the fields in IGNORED_FIELDS, which cannot change the output, are accepted and ignored.
To support a field: declare it on a model, use it, and take it out of NOT_YET_SUPPORTED.
Messages are checked as OpenAI checks them (server/history.py): a known role, content that is a string or
a non-empty list of text parts (null in an assistant message with tool_calls), a tool result naming an earlier call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from jacobi_rt.runtime import (
    DEFAULTS,
    STRATEGIES,
    Constraint,
    GenerationParams,
    InputError,
    SamplingParams,
    draw_seed,
)

from .errors import APIError
from .history import ChatMessage, checked_messages
from .structured import StructuredOutputs, constraint_of
from .tool_calls import ToolCalls

Number = StrictInt | StrictFloat


class JacobiOptions(BaseModel):
    """jacobi-rt's own knobs, in the request's "jacobi" field (openai client: extra_body={"jacobi": {...}}):
    the strategy, and any per-request field of runtime.config.DecodingConfig (checked by `decoding_overrides`)."""

    model_config = ConfigDict(extra="allow")
    strategy: Literal[STRATEGIES] | None = None  # type: ignore[valid-type]
    window: StrictInt | None = None
    jacobi_tail: StrictBool | None = None  # speculative: target predictions seed the draft's next window


def decoding_overrides(options: JacobiOptions) -> dict:
    """The DecodingConfig fields of a request's "jacobi" object, each checked (a 400 naming jacobi.FIELD)."""
    extra = dict(options.model_extra or {})
    for name, value in extra.items():  # an unknown name's error names the field it was probably meant to be
        try:
            DEFAULTS.with_overrides({name: value}, per_request=True)
        except InputError as exc:
            raise APIError(400, f"jacobi.{name}: {exc}", f"jacobi.{name}", "invalid_value") from None
    try:
        DEFAULTS.with_overrides(extra)
    except InputError as exc:  # fields that only fail together (draft.length over draft.max_length)
        raise APIError(400, f"jacobi: {exc}", "jacobi", "invalid_value") from None
    return extra


MAX_STOPS = 4
MAX_STOP_CHARS = 256  # text is held back by the longest stop string's length: a long one would hold back every piece

# Undeclared fields accepted and ignored: they cannot change the generated text.
IGNORED_FIELDS = frozenset(
    {
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",  # bookkeeping
        "parallel_tool_calls",
        "tool_choice",  # completions: about tools, which it does not take
        "prediction",  # OpenAI's predicted outputs: a latency hint
    }
)
# Fields jacobi-rt knows and does not support yet, with a better message than the generic one.
NOT_YET_SUPPORTED = {
    "logit_bias": "logit_bias is not supported by jacobi-rt yet (on chat and completions alike); leave it out",
    "tools": "tools are not supported: jacobi-rt does not call tools; leave tools out",
    "functions": "functions (and function_call) are not supported: jacobi-rt does not call tools",
    "function_call": "function_call is not supported: jacobi-rt does not call tools",
    **{
        name: f"{name}: not supported; use structured_outputs.{name[7:]} (vLLM's current name) or response_format"
        for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
    },
    **{
        name: f"{name}: not supported; use structured_outputs.{name.split('_')[0]} or response_format"
        for name in ("grammar", "json_schema")
    },
}
# What a server that does not constrain output yet (allow_constraints=False) says for each field.
CONSTRAINT_REFUSALS = {
    "response_format": 'response_format other than {"type": "text"} is not supported',
    "structured_outputs": "structured_outputs: constrained decoding is not supported; leave it out",
    "tool_choice": "tools are not supported: jacobi-rt does not call tools; leave tools out",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")  # include_obfuscation ...: the stream's shape, not its text
    include_usage: StrictBool = False


class CommonRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # undeclared fields: refused or ignored by _refuse_undeclared
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt | None = None
    seed: StrictInt | None = None  # sampling: choice i uses seed + i; none given: drawn and returned in `jacobi`
    user: StrictStr | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    jacobi: JacobiOptions | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None
    response_format: dict[str, Any] | None = None  # checked by server/structured.py
    structured_outputs: StructuredOutputs | None = None  # vLLM's
    top_k: StrictInt | None = None  # vLLM's extras
    min_p: Number | None = None
    repetition_penalty: Number | None = None


class CompletionRequest(CommonRequest):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None


@dataclass
class GenerationCall:
    """A checked request: Generator.start's arguments plus how to answer."""

    model: str | None
    prompt: str | list[int] | None  # None for chat
    messages: list[dict] | None  # None for completions
    max_tokens: int | None  # None: the endpoint's default
    params: GenerationParams  # the request's decoding (strategy filled in by the server when None below)
    strategy: str | None = None  # None: the server's default
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    seeds: list[int | None] = field(default_factory=lambda: [None])  # one per choice (n); None: greedy
    tools: ToolCalls | None = None  # chat with tools: how the reply presents a call
    tool_specs: list[dict] | None = None  # chat: the request's tools, for a chat template that renders them

    @property
    def constraint(self) -> Constraint | None:
        return self.params.constraint

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"


def parse_completion(payload: Any, allow_constraints: bool = False) -> GenerationCall:
    """allow_constraints: parse response_format and structured_outputs into `constraint` (False: refuse them)."""
    request = _validate(CompletionRequest, payload)
    _refuse_undeclared(request)
    _refuse_unsupported(request, echo=False, best_of=(None, 1), suffix=None)
    constraint, _ = _constraint(request, allow_constraints)
    logprobs = _bounded("logprobs", request.logprobs, MAX_COMPLETION_LOGPROBS)
    return _call(
        request,
        prompt=_single_prompt(request.prompt),
        messages=None,
        max_tokens=request.max_tokens,
        logprobs=logprobs,
        constraint=constraint,
    )


def parse_chat(payload: Any, allow_constraints: bool = False) -> GenerationCall:
    """allow_constraints: parse response_format, structured_outputs and tools with tool_choice into
    `constraint` and `tools` (False: refuse them, as a server that cannot honour them must)."""
    request = _validate(ChatRequest, payload)
    _refuse_undeclared(request)
    constraint, tools = _constraint(
        request, allow_constraints, request.tools, request.tool_choice, request.parallel_tool_calls
    )
    messages = checked_messages(request.messages)
    if (
        None not in (request.max_tokens, request.max_completion_tokens)
        and request.max_tokens != request.max_completion_tokens
    ):
        raise APIError(
            400,
            "max_tokens and max_completion_tokens (its newer name) differ; send one of them",
            "max_tokens",
            "invalid_value",
        )  # else one would be ignored
    if request.top_logprobs is not None and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
    logprobs = _bounded("top_logprobs", request.top_logprobs or 0, MAX_CHAT_LOGPROBS) if request.logprobs else None
    call = _call(
        request,
        prompt=None,
        messages=messages,
        max_tokens=request.max_completion_tokens or request.max_tokens,
        logprobs=logprobs,
        constraint=constraint,
    )
    call.tools = tools
    call.tool_specs = request.tools or None  # checked by constraint_of
    return call


def _constraint(
    request: CommonRequest,
    allowed: bool,
    tools: list | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
) -> tuple[Constraint | None, ToolCalls | None]:
    if not allowed:
        asked = {
            "response_format": request.response_format not in (None, {"type": "text"}),
            "structured_outputs": request.structured_outputs is not None,
            "tool_choice": bool(tools),
        }
        for name, given in asked.items():
            if given:
                param = "tools" if name == "tool_choice" else name
                raise APIError(400, CONSTRAINT_REFUSALS[name], param, "unsupported_value")
    return constraint_of(request.response_format, request.structured_outputs, tools, tool_choice, parallel_tool_calls)


def _validate(model: type[BaseModel], payload: Any) -> BaseModel:
    if not isinstance(payload, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(payload).__name__}", None, "invalid_type")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"] if not _UNION_BRANCH.match(str(part))]
        param = ".".join(loc) or None
        missing = first["type"] == "missing"
        problem = "this field is required" if missing else _HINTS.get(re.sub(r"\.\d+", "", param or ""), first["msg"])
        raise APIError(
            400, f"{param}: {problem}" if param else problem, param, "missing" if missing else "invalid_value"
        ) from None


_HINTS = {
    "prompt": "the prompt must be a string, a list of token ids, or a list holding one of these",
    "messages": 'messages must be a non-empty list like [{"role": "user", "content": "Hi"}]',
    "stop": "stop must be a string or a list of up to 4 strings",
    "messages.role": 'a message\'s role must be a string like "user"',
    "messages.content": "a message's content must be a string or a non-empty list of text parts like "
    '[{"type": "text", "text": "Hi"}]',
    **{
        name: "a number was expected"
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
    },
    **{name: "an integer was expected" for name in ("seed", "n", "top_k", "top_logprobs", "logprobs")},
}
# pydantic names the union member it tried (`str`, `list[int]`) in an error's location
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*)$")


def refuse_extra(extra: dict | None, ignored: frozenset, refusals: dict[str, str]) -> None:
    """A body's undeclared fields: those in `ignored` cannot change the output; any other is a 400 (with
    its message in `refusals` when it is a known field not served)."""
    for name in extra or {}:
        if name not in ignored:
            message = refusals.get(
                name, f"{name}: jacobi-rt does not know this field, and it may change the output; leave it out"
            )
            raise APIError(400, message, name, "unsupported_value")


def _refuse_undeclared(request: CommonRequest) -> None:
    refuse_extra(request.model_extra, IGNORED_FIELDS, NOT_YET_SUPPORTED)
    for i, message in enumerate(getattr(request, "messages", None) or []):
        for name, value in (message.model_extra or {}).items():
            if value not in (None, "", [], {}) and name not in ("refusal", "annotations"):  # as echoed back by OpenAI
                raise APIError(
                    400,
                    f"messages.{i}.{name}: not supported (the chat template gets only role and content); leave it out",
                    f"messages.{i}.{name}",
                    "unsupported_value",
                )


# Declared fields neither endpoint honours yet, refused by `_call` (which both parsers end with), so the rule is one:
# logit_bias would need a per-request bias before the pick under every strategy (the draft's and guesses' too).
REFUSED_ON_BOTH = dict(logit_bias=(None, {}))


def _refuse_unsupported(request: BaseModel, **allowed) -> None:
    for name, ok in allowed.items():
        value = getattr(request, name)
        if value not in (ok if isinstance(ok, tuple) else (ok,)):
            shown = f"={value!r}" if isinstance(value, (bool, int, str)) and len(repr(value)) <= 40 else ""
            raise APIError(
                400,
                NOT_YET_SUPPORTED.get(name, f"{name}{shown} is not supported by jacobi-rt yet; leave it out"),
                name,
                "unsupported_value",
            )


def _single_prompt(prompt: str | list) -> str | list[int]:
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return prompt
    if len(prompt) > 1:
        raise APIError(
            400,
            f"one prompt per request, not {len(prompt)}; send the prompts as separate (concurrent) requests",
            "prompt",
            "unsupported_value",
        )
    return prompt[0]


def _call(
    request: CommonRequest, prompt, messages, max_tokens, logprobs: int | None, constraint: Constraint | None = None
) -> GenerationCall:
    _refuse_unsupported(request, **REFUSED_ON_BOTH)
    if request.stream_options is not None and not request.stream:
        raise APIError(
            400,
            "stream_options is only allowed with stream: true; leave it out or stream the answer",
            "stream_options",
            "invalid_value",
        )
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    options = request.jacobi or JacobiOptions()
    sampling, seeds = _sampling(request, logprobs)
    params = GenerationParams(
        window=options.window,
        stop=tuple(_checked_stops(stops)),
        jacobi_tail=options.jacobi_tail,
        config=decoding_overrides(options) or None,
        sampling=sampling,
        constraint=constraint,
    )
    return GenerationCall(
        model=request.model,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        params=params,
        strategy=options.strategy,
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        user=request.user,
        seeds=seeds,
    )


MAX_N = 16
MAX_CHAT_LOGPROBS = 20  # OpenAI's limits
MAX_COMPLETION_LOGPROBS = 5


def _bounded(name: str, value: int | None, limit: int) -> int | None:
    if value is not None and not 0 <= value <= limit:
        raise APIError(400, f"{name} must be an integer from 0 to {limit}, not {value}", name, "invalid_value")
    return value


def _sampling(request: CommonRequest, logprobs: int | None) -> tuple[SamplingParams, list[int | None]]:
    """The sampling, checked by the runtime's own SamplingParams, and a seed per choice (seed, seed + 1, ...)."""
    n = 1 if request.n is None else request.n
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer from 1 to {MAX_N}, not {n}", "n", "invalid_value")
    given = dict(
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
    )
    sampling = {name: value for name, value in given.items() if value is not None}
    try:
        params = SamplingParams(**sampling, seed=request.seed, logprobs=logprobs)
    except InputError as exc:
        name = str(exc).split(" ", 1)[0]
        raise APIError(400, str(exc), name, "invalid_value") from None
    if params.temperature == 0:
        seeds: list[int | None] = [None] * n  # greedy (penalties or not): nothing to seed
    else:
        first = draw_seed() if params.seed is None else params.seed
        seeds = [(first + i) % 2**64 for i in range(n)]
    return params, seeds


def _checked_stops(stops: Sequence[str]) -> list[str]:
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"at most {MAX_STOPS} stop sequences, not {len(stops)}", "stop", "invalid_value")
    if any(not s for s in stops):
        raise APIError(400, "stop sequences must be non-empty strings", "stop", "invalid_value")
    longest = max(map(len, stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise APIError(
            400,
            f"stop sequences may be at most {MAX_STOP_CHARS} characters long, not {longest}",
            "stop",
            "invalid_value",
        )
    return list(stops)
