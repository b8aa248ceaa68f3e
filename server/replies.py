"""How each endpoint writes its answer: a whole JSON object, or server-sent-event chunks in OpenAI's format.

A stream is: (chat only) a chunk with the assistant's role, one chunk per text piece, a chunk with
`finish_reason` and the `jacobi` stats, a usage chunk (`choices: []`) when the request set
`stream_options.include_usage`, then `data: [DONE]`. A stream that fails after it began (the
request timed out, the runtime failed) sends `data: {"error": {...}}` and then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from jacobi_rt.runtime.generator import GenerationResult

# the runtime's finish reasons -> OpenAI's ("context": the model's context was full)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
DONE = b"data: [DONE]\n\n"


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def usage(result: GenerationResult) -> dict:
    s = result.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.new_tokens, "total_tokens": s.prompt_tokens + s.new_tokens}


def jacobi_stats(result: GenerationResult) -> dict:
    """jacobi-rt's extension field: how the answer was decoded (the text is greedy's either way)."""
    s = result.stats
    return {"strategy": s.strategy, "window": s.window, "adaptive": s.adaptive, "target_passes": s.target_passes,
            "tokens_per_pass": s.tokens_per_pass, "prefill_passes": s.prefill_passes,
            "decode_tokens_per_second": s.decode_tokens_per_second, "wall_seconds": s.wall_seconds,
            "finish_reason": s.finish_reason}


@dataclass
class Reply:
    """One response's identity and shape; `chat` picks chat.completion(.chunk) over text_completion."""

    model: str
    chat: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def whole(self, result: GenerationResult) -> dict:
        finish = FINISH_REASONS[result.stats.finish_reason]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(result), "jacobi": jacobi_stats(result)}

    def opening(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def piece(self, text: str) -> dict:
        return self._chunk({"content": text} if self.chat else text, None)

    def closing(self, result: GenerationResult) -> dict:
        chunk = self._chunk({} if self.chat else "", FINISH_REASONS[result.stats.finish_reason])
        return {**chunk, "jacobi": jacobi_stats(result)}

    def usage_chunk(self, result: GenerationResult) -> dict:
        return {**self._head(self._chunk_object), "choices": [], "usage": usage(result)}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, content, finish: str | None) -> dict:
        key = "delta" if self.chat else "text"
        choice = {"index": 0, key: content, "logprobs": None, "finish_reason": finish}
        return {**self._head(self._chunk_object), "choices": [choice]}
