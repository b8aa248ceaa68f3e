"""Request bodies: the OpenAI fields jacobi-rt reads, checked with pydantic, turned into a GenerationCall.

Fields that would change the output in ways jacobi-rt cannot honour yet (sampling, n > 1,
penalties, logprobs, tools) are refused with a 400 that says so, rather than silently ignored;
other unknown fields are ignored, as OpenAI clients send many.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from jacobi_rt.runtime.generator import STRATEGIES

from .errors import APIError

Number = Union[StrictInt, StrictFloat]


class JacobiOptions(BaseModel):
    """jacobi-rt's own knobs, in the request's "jacobi" field (openai client: extra_body={"jacobi": {...}})."""

    model_config = ConfigDict(extra="forbid")
    strategy: Literal[STRATEGIES] | None = None  # type: ignore[valid-type]
    window: StrictInt | None = None
    jacobi_tail: StrictBool | None = None  # speculative: target predictions seed the draft's next window


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class CommonRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt | None = None
    seed: StrictInt | None = None  # accepted and unused: greedy decoding is deterministic
    user: StrictStr | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    jacobi: JacobiOptions | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None


class CompletionRequest(CommonRequest):
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None


class ChatRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: StrictBool | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


@dataclass
class GenerationCall:
    """A checked request: Generator.start's arguments plus how to answer."""

    model: str | None
    prompt: str | list[int] | None  # None for chat
    messages: list[dict] | None  # None for completions
    max_tokens: int | None  # None: the endpoint's default
    stop: list[str] = field(default_factory=list)
    strategy: str | None = None  # None: the server's default
    window: int | None = None
    jacobi_tail: bool | None = None  # None: the runtime's default
    stream: bool = False
    include_usage: bool = False
    user: str | None = None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"


def parse_completion(payload: Any) -> GenerationCall:
    request = _validate(CompletionRequest, payload)
    _refuse_unsupported(request, echo=False, logprobs=None, best_of=(None, 1), suffix=None)
    return _call(request, prompt=_single_prompt(request.prompt), messages=None, max_tokens=request.max_tokens)


def parse_chat(payload: Any) -> GenerationCall:
    request = _validate(ChatRequest, payload)
    _refuse_unsupported(request, logprobs=(None, False), tools=(None, []))
    if request.response_format not in (None, {"type": "text"}):
        raise APIError(400, "response_format other than {\"type\": \"text\"} is not supported", "response_format", "unsupported_value")
    messages = [{"role": m.role, "content": _text_content(m, i)} for i, m in enumerate(request.messages)]
    return _call(request, prompt=None, messages=messages, max_tokens=request.max_completion_tokens or request.max_tokens)


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
        problem = "this field is required" if missing else _HINTS.get(param, first["msg"])
        raise APIError(400, f"{param}: {problem}" if param else problem, param, "missing" if missing else "invalid_value") from None


_HINTS = {
    "prompt": "the prompt must be a string, a list of token ids, or a list holding one of these",
    "messages": 'messages must be a non-empty list like [{"role": "user", "content": "Hi"}]',
    "stop": "stop must be a string or a list of up to 4 strings",
    **{name: "a number was expected" for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty")},
}
# pydantic names the union member it tried (`str`, `list[int]`) in an error's location
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\]|function-.*)$")


def _refuse_unsupported(request: BaseModel, **allowed) -> None:
    common = dict(temperature=(None, 0), top_p=(None, 1), n=(None, 1), presence_penalty=(None, 0),
                  frequency_penalty=(None, 0), logit_bias=(None, {}))
    for name, ok in {**common, **allowed}.items():
        value = getattr(request, name)
        if value not in (ok if isinstance(ok, tuple) else (ok,)):
            raise APIError(400, _UNSUPPORTED.get(name, f"{name}={value!r} is not supported by jacobi-rt yet; leave it out"),
                           name, "unsupported_value")


_UNSUPPORTED = {
    "temperature": "temperature must be 0 (or left out): jacobi-rt decodes greedily, token for token; sampling is not supported yet",
    "top_p": "top_p must be 1 (or left out): jacobi-rt decodes greedily; sampling is not supported yet",
    "n": "n must be 1: greedy decoding gives one answer per prompt",
}


def _single_prompt(prompt: str | list) -> str | list[int]:
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return prompt
    if len(prompt) > 1:
        raise APIError(400, f"one prompt per request, not {len(prompt)}; send the prompts as separate (concurrent) requests",
                       "prompt", "unsupported_value")
    return prompt[0]


def _text_content(message: ChatMessage, index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise APIError(400, f"messages.{index}.content: only text parts are supported, not {part.type!r}",
                           f"messages.{index}.content", "unsupported_value")
        texts.append(part.text)
    return "".join(texts)


def _call(request: CommonRequest, prompt, messages, max_tokens) -> GenerationCall:
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    options = request.jacobi or JacobiOptions()
    return GenerationCall(
        model=request.model,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        stop=_checked_stops(stops),
        strategy=options.strategy,
        window=options.window,
        jacobi_tail=options.jacobi_tail,
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        user=request.user,
    )


def _checked_stops(stops: Sequence[str]) -> list[str]:
    if len(stops) > 4:
        raise APIError(400, f"at most 4 stop sequences, not {len(stops)}", "stop", "invalid_value")
    if any(not s for s in stops):
        raise APIError(400, "stop sequences must be non-empty strings", "stop", "invalid_value")
    return list(stops)
