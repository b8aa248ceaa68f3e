"""ServerSettings: everything `jacobi-rt serve` can be told, as one record with checked limits."""

from __future__ import annotations

from dataclasses import dataclass

from jacobi_rt.runtime import DEFAULT_SLOTS, STRATEGIES, InputError

SERVE_HINT = 'pip install ".[serve]" from the jacobi-rt checkout'


@dataclass
class ServerSettings:
    model_id: str  # the name clients pass as "model" (and /v1/models lists)
    queue_size: int = 32  # requests waiting for a worker; beyond workers + queue_size: 429
    request_timeout: float = 300.0  # seconds from arrival (queue wait included) to the last token
    max_body_bytes: int = 1 << 20  # larger bodies get 413
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer KEY"
    default_strategy: str = "auto"  # when a request names none in its "jacobi" field
    completion_max_tokens: int = (
        16  # /v1/completions without max_tokens (OpenAI's default); chat: the rest of the context
    )
    retry_after_seconds: int = 1  # the Retry-After header of a 429
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish on shutdown before they are cancelled
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides the address connected to ("*": any; see hosts.py)
    docs: bool = False  # serve the interactive API docs at /docs (and /openapi.json)
    max_batch: int | None = None  # generations sharing each pass (the batcher's slots); None: Generator.default_slots()
    batch_context: int | None = (
        None  # each slot's context (prompt + output); None: the artifact's (capped for scatter attention)
    )

    @property
    def running_at_once(self) -> int:
        """Generations that run at once before the batcher is open: max_batch, else at most DEFAULT_SLOTS."""
        return self.max_batch or DEFAULT_SLOTS

    def __post_init__(self) -> None:
        if not self.model_id:
            raise InputError("the served model needs a name (model_id)")
        for name in ("max_body_bytes", "completion_max_tokens", "retry_after_seconds"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_batch is not None and (isinstance(self.max_batch, bool) or self.max_batch < 1):
            raise InputError(
                f"max_batch must be at least 1 (the generations that share each pass), not {self.max_batch}; "
                "leave it out to size it from the artifact and memory"
            )
        if self.batch_context is not None and self.batch_context < 2:
            raise InputError(f"batch_context (a slot's context) must be at least 2 tokens, not {self.batch_context}")
        if self.queue_size < 0:
            raise InputError(f"queue_size must be 0 or more, not {self.queue_size}")
        if self.request_timeout <= 0 or self.shutdown_grace < 0:
            raise InputError("request_timeout must be positive and shutdown_grace not negative")
        if self.default_strategy not in STRATEGIES:
            raise InputError(f"default_strategy must be one of {', '.join(STRATEGIES)}, not {self.default_strategy!r}")
