"""APIError: an HTTP error in OpenAI's shape, {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging
import uuid

from jacobi_rt.runtime import ContextLimitError, InputError

LOG = logging.getLogger("jacobi_rt.server")

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
    504: "timeout_error",
}


class APIError(Exception):
    """Raised anywhere in a request; the app turns it into a JSON response with this status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def from_input_error(exc: InputError, prompt_param: str) -> APIError:
    """A request the runtime refused (empty prompt, ids out of vocabulary, prompt over the context)."""
    if isinstance(exc, ContextLimitError):
        return APIError(400, str(exc), prompt_param, "context_length_exceeded")
    text = str(exc)
    param = next((p for p in ("window", "strategy", "stop", "max_new_tokens") if p in text), prompt_param)
    param = {"window": "jacobi.window", "strategy": "jacobi.strategy", "max_new_tokens": "max_tokens"}.get(param, param)
    return APIError(400, text, param, "invalid_value")


def timeout_error(seconds: float) -> APIError:
    return APIError(
        504,
        f"the request did not finish within the server's timeout of {seconds:g} s; "
        "ask for fewer tokens (max_tokens) or retry when the server is less busy",
        code="timeout",
    )


def internal_error(exc: BaseException) -> APIError:
    """A 500 that names only a request id; the exception (node names, paths) goes to the server's log."""
    request_id = "req-" + uuid.uuid4().hex[:16]
    LOG.error("request %s failed", request_id, exc_info=exc)
    return APIError(
        500,
        f"internal server error (request id {request_id}: the server's log has the details)",
        code="internal_error",
        headers={"X-Request-Id": request_id},
    )
