"""The OpenAPI document of `serve --docs` (`/openapi.json`): the bodies the routes parse, the answers they
write, and every status they return, so a tool (schemathesis, a client generator) can make real requests.

The routes read their bodies themselves (bodies.py, then schemas.py and responses.py: a 400 naming the
field, never FastAPI's 422), so FastAPI knows no body model; `document(app, limits)` adds them. Each
request schema starts from the pydantic model the route parses (its fields as they are) and is narrowed
to what the server takes: the ranges the parsers check, `additionalProperties: false` (an undeclared
field is a 400), the fields only served at their default held to it (`logit_bias` empty, `echo` false).
What JSON Schema cannot say stays a 400 with a schema-valid body (a prompt + max_tokens over the context,
a json_schema or grammar that does not compile, a tool result naming no earlier call): the operation
descriptions say so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from jacobi_rt.runtime import MIN_TEMPERATURE, REPETITION_RANGE, SEED_RANGE, STRATEGIES

from .responses import IGNORED as RESPONSES_IGNORED
from .responses import ResponsesRequest
from .schemas import (
    IGNORED_FIELDS,
    MAX_CHAT_LOGPROBS,
    MAX_COMPLETION_LOGPROBS,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOPS,
    ChatRequest,
    CompletionRequest,
)

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Served:
    """What the document depends on in the served model."""

    model_id: str
    max_context: int
    vocab_size: int
    api_key: bool  # /v1/* answers 401 without the key
    draft: bool  # jacobi.jacobi_tail needs a draft model


# -- the narrowed request fields ------------------------------------------------------------------


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _sampling() -> dict[str, dict]:
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
    return {
        "temperature": _nullable(
            {
                "anyOf": [{"const": 0}, {"type": "number", "minimum": MIN_TEMPERATURE}],
                "description": f"0 or absent: greedy; sampling needs at least {MIN_TEMPERATURE:g}",
            }
        ),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": _nullable({"type": "integer", "minimum": 0}),
        "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "repetition_penalty": _nullable(
            {"type": "number", "minimum": REPETITION_RANGE[0], "maximum": REPETITION_RANGE[1]}
        ),
        "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "seed": _nullable({"type": "integer", "minimum": SEED_RANGE[0], "maximum": SEED_RANGE[1] - 1}),
        "stop": _nullable({"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOPS}]}),
        "jacobi": _nullable({"$ref": REF.format(model="JacobiOptions")}),
    }


def _common(served: Served) -> dict[str, dict]:
    tokens = _nullable(
        {
            "type": "integer",
            "minimum": 1,
            "maximum": served.max_context - 1,
            "description": "at most the context less the prompt's tokens (else a 400 naming max_tokens)",
        }
    )
    return {
        **_sampling(),
        "model": _nullable({"type": "string", "enum": [served.model_id]}),
        "max_tokens": tokens,
        "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
        "logit_bias": _nullable(
            {
                "type": "object",
                "maxProperties": 0,
                "description": "not applied yet: refused (400) unless empty, on every endpoint",
            }
        ),
        "stream_options": _nullable(
            {"$ref": REF.format(model="StreamOptions"), "description": "only with stream: true"}
        ),
        "response_format": _nullable(
            {
                "anyOf": [
                    _closed({"type": {"enum": ["text", "json_object"]}}),
                    _closed({"type": {"const": "json_schema"}, "json_schema": _SCHEMA}),
                ]
            }
        ),
    }


def _completion(served: Served) -> dict[str, dict]:
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": served.vocab_size - 1}}
    text = {"type": "string", "minLength": 1}
    return {
        "prompt": {
            "anyOf": [
                text,
                ids,
                {"type": "array", "items": text, "minItems": 1, "maxItems": 1},
                {"type": "array", "items": ids, "minItems": 1, "maxItems": 1},
            ]
        },
        "logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS}),
        "echo": {"const": False, "description": "not served: only false"},
        "best_of": _nullable({"const": 1, "description": "not served: only 1"}),
        "suffix": {"type": "null", "description": "not served"},
    }


def _chat(served: Served) -> dict[str, dict]:
    return {
        "messages": {"type": "array", "minItems": 1, "items": {"$ref": REF.format(model="ChatMessage")}},
        "max_completion_tokens": _common(served)["max_tokens"],
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _nullable(
            {"type": "integer", "minimum": 0, "maximum": MAX_CHAT_LOGPROBS, "description": "needs logprobs: true"}
        ),
    }


def _responses(served: Served) -> dict[str, dict]:
    sampling = _sampling()
    return {
        **{name: sampling[name] for name in sampling if name != "jacobi"},
        "jacobi": _nullable({"$ref": REF.format(model="JacobiOptions")}),
        "model": _nullable({"type": "string", "enum": [served.model_id]}),
        "max_output_tokens": _common(served)["max_tokens"],
        "background": _nullable({"const": False, "description": "not served: only false"}),
        "include": _nullable({"type": "array", "maxItems": 0}),
        "truncation": _nullable({"const": "disabled"}),
        "top_logprobs": _nullable({"const": 0, "description": "not served on /v1/responses"}),
        "max_tool_calls": {"type": "null", "description": "not served"},
        "text": _nullable(_text_options()),
    }


def _text_options() -> dict:
    """text: format (null or absent: text); its other keys (verbosity) only null."""
    schema = _closed({"type": {"const": "json_schema"}, **_SCHEMA["properties"]}, ["type", "name", "schema"])
    plain = _closed({"type": {"enum": ["text", "json_object"]}}, [])
    return {**_closed({"format": _nullable({"anyOf": [plain, schema]})}, []), "additionalProperties": {"type": "null"}}


def _closed(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


_SCHEMA = _closed(
    {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "schema": {"type": "object", "description": "a JSON schema llguidance compiles (else a 400 naming it)"},
        "strict": {"type": ["boolean", "null"]},
    },
    ["name", "schema"],
)


def _ignored(names: frozenset[str]) -> dict[str, dict]:
    return {name: {"description": "accepted and ignored: it cannot change the output"} for name in sorted(names)}


# Nested models: closed where the parser refuses undeclared fields, and the message roles named.
_CLOSED = ("StructuredOutputs", "StreamOptions")
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],  # other keys of a part are ignored
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}


def _request_schemas(served: Served) -> dict[str, dict]:
    """components/schemas for the three request bodies and the models they nest."""
    models: list[tuple[type[BaseModel], str]] = [
        (m, "validation") for m in (ChatRequest, CompletionRequest, ResponsesRequest)
    ]
    _, top = models_json_schema(models, ref_template=REF)
    schemas = copy.deepcopy(top["$defs"])
    for name, narrowed, ignored in (
        ("ChatRequest", {**_common(served), **_chat(served)}, IGNORED_FIELDS),
        ("CompletionRequest", {**_common(served), **_completion(served)}, IGNORED_FIELDS),
        ("ResponsesRequest", _responses(served), RESPONSES_IGNORED),
    ):
        schemas[name]["properties"].update(narrowed)
        schemas[name]["properties"] = {**_ignored(ignored), **schemas[name]["properties"]}  # declared ones win
        schemas[name]["additionalProperties"] = False
    for name in _CLOSED:
        schemas[name]["additionalProperties"] = False
    schemas["ChatMessage"] = _message(schemas["ChatMessage"])
    for name in ("ChatRequest", "CompletionRequest"):
        schemas[name]["allOf"] = [_only_with("stream_options", "stream", True)]
    schemas["ChatRequest"]["allOf"].append(_only_with("top_logprobs", "logprobs", True, "integer"))
    responses = schemas["ResponsesRequest"]
    responses["required"] = ["input"]
    responses["properties"]["input"] = {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
        "description": "required unless previous_response_id names a stored response",
    }
    options = schemas["JacobiOptions"]["properties"]
    options["window"] = _nullable({"type": "integer", "minimum": 1, "maximum": 64})
    if not served.draft:
        options["strategy"] = _nullable(
            {
                "enum": [s for s in STRATEGIES if s != "speculative"],
                "description": "speculative needs a draft model (serve --draft)",
            }
        )
        options["jacobi_tail"] = {"type": "null", "description": "needs a draft model (serve --draft)"}
    return schemas


def _message(declared: dict) -> dict:
    """A chat message: content (text or text parts) and a role; null content only beside tool_calls. A tool or
    function result must name a call of an earlier assistant message (not expressible here: see docs/serve.md)."""
    content = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _TEXT_PART}]}
    plain = {
        "type": "object",
        "required": ["role", "content"],
        "additionalProperties": False,
        "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]}, "content": content},
    }
    calls = {
        "type": "object",
        "required": ["role", "tool_calls"],
        "additionalProperties": False,
        "properties": {
            "role": {"const": "assistant"},
            "content": _nullable(content),
            "tool_calls": {
                "type": "array",
                "minItems": 1,
                "items": declared["properties"]["tool_calls"]["anyOf"][0]["items"],
            },
        },
    }
    return {"anyOf": [plain, calls], "description": _message.__doc__.split(". ", 1)[1]}


def _only_with(field: str, needs: str, value: Any, kind: str = "object") -> dict:
    """`field` (when not null) only together with `needs` = `value`."""
    return {
        "if": {"required": [field], "properties": {field: {"type": kind}}},
        "then": {"required": [needs], "properties": {needs: {"const": value}}},
    }


# -- the answers ----------------------------------------------------------------------------------


def _object(required: dict[str, Any], **optional: Any) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


_ERROR = _object(
    {
        "error": _object(
            {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            }
        )
    }
)
_USAGE = _object(
    {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    }
)
_FINISH = {"type": "string", "enum": ["stop", "length", "tool_calls"]}
_JACOBI = {"type": "object", "description": "how the answer was decoded (strategy, tokens per pass ...) and its seed"}
_MESSAGE = _object(
    {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]}},
    tool_calls={"type": "array", "items": {"type": "object"}},
)
_MODEL = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    jacobi={"type": "object"},
)


def _completion_object(chat: bool) -> dict:
    choice = _object(
        {
            "index": {"type": "integer"},
            "finish_reason": _FINISH,
            "logprobs": {"type": ["object", "null"]},
            **({"message": _MESSAGE} if chat else {"text": {"type": "string"}}),
        }
    )
    return _object(
        {
            "id": {"type": "string"},
            "object": {"const": "chat.completion" if chat else "text_completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": _USAGE,
        },
        jacobi=_JACOBI,
    )


_RESPONSE = _object(
    {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"type": "string", "enum": ["completed", "incomplete"]},
        "model": {"type": "string"},
        "output": {
            "type": "array",
            "items": _object({"type": {"type": "string", "enum": ["message", "function_call"]}}),
        },
        "usage": _object(
            {
                "input_tokens": {"type": "integer"},
                "output_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
            }
        ),
    },
    incomplete_details={"type": ["object", "null"]},
    jacobi=_JACOBI,
)
ANSWERS = {
    "ChatCompletion": _completion_object(chat=True),
    "Completion": _completion_object(chat=False),
    "Response": _RESPONSE,
    "Model": _MODEL,
    "ModelList": _object({"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}}),
    "Health": _object(
        {
            "status": {"const": "ok"},
            "model": {"type": "string"},
            "running": {"type": "integer"},
            "queued": {"type": "integer"},
        }
    ),
    "ResponseDeleted": _object({"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}),
    "Error": _ERROR,
}


# -- the statuses ---------------------------------------------------------------------------------

WHY = {
    "400": "invalid JSON or a field the server cannot honour (the error names it)",
    "401": "missing or wrong API key (with --api-key)",
    "403": "a Host header that is not this server's address",
    "404": "unknown model",
    "405": "wrong method",
    "413": "body over --max-body",
    "415": "not application/json",
    "429": "every slot and queue place is taken (Retry-After)",
    "500": "internal error (a request id only)",
    "503": "shutting down",
    "504": "--timeout passed",
}
GENERATING = ("400", "401", "403", "404", "413", "415", "429", "500", "503", "504")


def _json(name: str, stream: bool = False) -> dict:
    content = {"application/json": {"schema": {"$ref": REF.format(model=name)}}}
    if stream:
        content["text/event-stream"] = {}  # server-sent events (stream: true): data: CHUNK, ..., data: [DONE]
    return content


def _errors(codes: tuple[str, ...]) -> dict:
    return {code: {"description": WHY[code], "content": _json("Error")} for code in codes}


def _retry_after(responses: dict) -> dict:
    if "429" in responses:
        responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
    return responses


ROUTES = {  # (method, path) -> (request model, answer model, streams, error statuses)
    ("post", "/v1/chat/completions"): ("ChatRequest", "ChatCompletion", True, GENERATING),
    ("post", "/v1/completions"): ("CompletionRequest", "Completion", True, GENERATING),
    ("post", "/v1/responses"): ("ResponsesRequest", "Response", True, GENERATING),
    ("get", "/v1/responses/{response_id}"): (None, "Response", False, ("401", "403", "404")),
    ("delete", "/v1/responses/{response_id}"): (None, "ResponseDeleted", False, ("401", "403", "404")),
    ("get", "/v1/models"): (None, "ModelList", False, ("401", "403")),
    ("get", "/v1/models/{model}"): (None, "Model", False, ("401", "403", "404")),
    ("get", "/health"): (None, "Health", False, ("403",)),
    ("get", "/metrics"): (None, None, False, ("403",)),
}


def document(app: FastAPI, served: Served) -> dict:
    """The app's OpenAPI document with its real bodies, answers and statuses."""
    doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for unsent in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422: the server never sends it
        schemas.pop(unsent, None)
    schemas.update(_request_schemas(served), **ANSWERS)
    for (method, path), (body, answer, streams, codes) in ROUTES.items():
        for operation in [doc["paths"][path][method]] if method in doc["paths"].get(path, {}) else []:
            if not served.api_key:
                codes = tuple(code for code in codes if code != "401")
            ok = {"description": "OK", **({"content": _json(answer, streams)} if answer else {})}
            if path == "/metrics":
                ok = {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
            operation["responses"] = _retry_after({"200": ok, **_errors(codes)})
            if body:
                operation["requestBody"] = {"required": True, "content": _json(body)}
    return doc


def install(app: FastAPI, served: Served) -> None:
    """Serve `document` as the app's /openapi.json (made once, on first request)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document(app, served)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
