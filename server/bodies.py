"""read_body(request, limit) then parse_json(body): a request body as JSON, every client mistake a 4xx.

415 without Content-Type: application/json (a browser page can send text/plain to a local server
without a CORS preflight; it cannot send application/json), 413 over the size limit, 400 for
invalid UTF-8 or JSON, nesting deeper than MAX_DEPTH, an integer longer than MAX_INT_DIGITS, or a
lone UTF-16 surrogate ("\\ud800": valid JSON, but no tokenizer can encode it). A client that
leaves before its whole body arrived raises starlette's ClientDisconnect.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from .errors import APIError

MAX_DEPTH = 64  # OpenAI request bodies nest a few levels; tools' JSON schemas a dozen
MAX_INT_DIGITS = 40  # no field takes more: seeds are 64-bit (20 digits); Python refuses 4300 with a message about sys
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body: 415 unless it is declared JSON, 413 over `limit` bytes (declared or as read)."""
    _check_content_type(request.headers.get("content-type", ""))
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def parse_json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the body is not UTF-8 ({exc})") from None
    try:
        payload = json.loads(text, parse_int=_int)
    except ValueError as exc:
        raise _invalid(f"the body is not valid JSON ({exc})") from None
    except RecursionError:
        raise _invalid(f"the JSON nests more than {MAX_DEPTH} levels deep") from None
    _check_structure(payload, strings=_SURROGATE_ESCAPE.search(text) is not None)
    return payload


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _invalid(
            f"the JSON holds an integer of {len(digits.lstrip('-'))} digits; no field takes one of more than "
            f"{MAX_INT_DIGITS} (a seed is a 64-bit integer)"
        )
    return int(digits)


def _check_content_type(header: str) -> None:
    kind = header.split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise APIError(
            415,
            f"send the body as JSON with the header Content-Type: application/json (got {kind or 'none'!r})",
            None,
            "unsupported_media_type",
        )


def _check_structure(payload: Any, strings: bool) -> None:
    """Depth at most MAX_DEPTH; with `strings`, no lone surrogate in any string or key. Iterative: no recursion."""
    stack = [(payload, 1, None)]  # (value, depth, top-level key)
    while stack:
        value, depth, top = stack.pop()
        if depth > MAX_DEPTH:
            raise _invalid(f"the JSON nests more than {MAX_DEPTH} levels deep", top)
        if isinstance(value, dict):
            items = value.items()
            if strings:
                for key in value:
                    _check_string(key, top or key)
            stack.extend((v, depth + 1, top or k) for k, v in items if isinstance(v, (dict, list)) or strings)
        elif isinstance(value, list):
            stack.extend((v, depth + 1, top) for v in value if isinstance(v, (dict, list)) or strings)
        elif strings and isinstance(value, str):
            _check_string(value, top)


def _check_string(text: str, top: str | None) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400,
            f"{top + ': ' if top else ''}a string holds a lone UTF-16 surrogate (such as \\ud800), "
            "which is not text; send valid Unicode",
            top,
            "invalid_value",
        ) from None


def _invalid(message: str, param: str | None = None) -> APIError:
    return APIError(400, f"{message}; send a JSON object with Content-Type: application/json", param, "invalid_json")


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than this server's limit of {limit} bytes", None, "body_too_large"
    )
