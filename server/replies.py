"""How each endpoint writes its answer: a whole JSON object, or server-sent-event chunks in OpenAI's format.

A stream is: (chat only) a chunk with the assistant's role, one chunk per text piece with the logprobs
of the tokens committed since the last chunk (when asked for), a chunk with `finish_reason`, the
`jacobi` stats and the logprobs not yet sent (per choice when n > 1), a usage chunk (`choices: []`)
when the request set `stream_options.include_usage`, then `data: [DONE]`. A stream that fails after
it began (the request timed out, the runtime failed) sends `data: {"error": {...}}` and then `data: [DONE]`.
A reply with tools (`ToolCalls`) streams as OpenAI does (server/tool_stream.py): per call a first delta
with its index, id, type and name, then its arguments in fragments as they are committed; a plain
"auto" answer as content deltas once it is known to be one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from jacobi_rt.runtime import GenerationResult, TokenLogprob

from .tool_calls import ToolCalls
from .tool_stream import ToolDeltas

__all__ = ["DONE", "FINISH_REASONS", "Reply", "ToolCalls", "sse", "usage", "jacobi_stats"]

# the runtime's finish reasons -> OpenAI's ("context": the model's context was full)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


DONE = b"data: [DONE]\n\n"


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def usage(results: list[GenerationResult]) -> dict:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache held (the first
    choice's)."""
    prompt, completion = results[0].stats.prompt_tokens, sum(r.stats.new_tokens for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": results[0].stats.cached_tokens},
    }


def jacobi_stats(result: GenerationResult, seeds: list[int | None] | None = None) -> dict:
    """jacobi-rt's extension field: how the answer was decoded (the text is the same whatever the
    strategy) and the sampling seed (drawn when the request gave none), to reproduce it."""
    s = result.stats
    stats = {
        "strategy": s.strategy,
        "window": s.window,
        "adaptive": s.adaptive,
        "target_passes": s.target_passes,
        "tokens_per_pass": s.tokens_per_pass,
        "prefill_passes": s.prefill_passes,
        "decode_tokens_per_second": s.decode_tokens_per_second,
        "wall_seconds": s.wall_seconds,
        "finish_reason": s.finish_reason,
        "seed": s.seed,
    }
    if seeds is not None and len(seeds) > 1:
        stats["seeds"] = seeds  # choice i's seed
    if s.constraint is not None:  # a constrained output: its masks' seconds and rows, forced tokens sent and committed
        stats["constraint"] = s.constraint
    return stats


@dataclass
class ChoiceStream:
    """What one choice's stream has sent: its text so far, its tool-call deltas, its logprobs."""

    text: str = ""
    deltas: ToolDeltas | None = None
    logprobs_sent: int = 0  # the tokens whose logprobs a chunk carried
    offset: int = 0  # completions: the text offset of the next token's logprobs


@dataclass
class Reply:
    """One response's identity and shape; `chat` picks chat.completion(.chunk) over text_completion."""

    model: str
    chat: bool
    token_text: Callable[[int], str] = str  # a token id's text, for logprobs
    tools: ToolCalls | None = None  # chat with tool_choice: the output is presented as tool calls
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    streams: dict[int, ChoiceStream] = field(default_factory=dict)  # by choice index, as a stream goes

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def whole(self, results: list[GenerationResult]) -> dict:
        choices = []
        for index, result in enumerate(results):
            finish = FINISH_REASONS[result.stats.finish_reason]
            if self.tools is not None:
                content, calls = self.tools.message(result.text, cut=finish == "length")
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                    finish = "tool_calls" if finish == "stop" else finish
                choice = {"index": index, "message": message}
            elif self.chat:
                choice = {"index": index, "message": {"role": "assistant", "content": result.text}}
            else:
                choice = {"index": index, "text": result.text}
            choices.append({**choice, "logprobs": self._logprobs(result.logprobs), "finish_reason": finish})
        return {
            **self._head("chat.completion" if self.chat else "text_completion"),
            "choices": choices,
            "usage": usage(results),
            "jacobi": jacobi_stats(results[0], [r.stats.seed for r in results]),
        }

    def _logprobs(self, logprobs: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """OpenAI's logprobs object: chat's {"content": [...]}, or completions' four parallel lists
        (`offset`: the text offset of the first token)."""
        if logprobs is None:
            return None
        if self.chat:
            return {
                "content": [
                    {**self._token(lp.token, lp.logprob), "top_logprobs": [self._token(i, v) for i, v in lp.top]}
                    for lp in logprobs
                ]
            }
        tokens = [self.token_text(lp.token) for lp in logprobs]
        offsets = [offset + sum(map(len, tokens[:i])) for i in range(len(tokens))]
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self.token_text(i): v for i, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

    def _token(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def opening(self, n: int = 1) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None, i) for i in range(n)] if self.chat else []

    def piece(
        self, text: str, index: int = 0, logprobs: list[TokenLogprob] | None = None, tokens: int = 0
    ) -> list[dict]:
        """The chunks a text piece makes (none while a reply with tools is still undecided); `logprobs`:
        the choice's logprobs so far, of which the first `tokens` are committed (sent with the next chunk)."""
        stream = self._stream(index)
        stream.text += text
        if stream.deltas is not None:
            deltas = stream.deltas.feed(stream.text)
        else:
            deltas = [{"content": text} if self.chat else text]
        return self._chunks(stream, index, deltas, None if logprobs is None else logprobs[:tokens])

    def closing(self, result: GenerationResult, index: int = 0) -> list[dict]:
        """The choice's last chunks: what is left of its tool calls, then finish_reason, the stats and
        the logprobs not yet sent."""
        stream = self._stream(index)
        finish = FINISH_REASONS[result.stats.finish_reason]
        deltas = []
        if stream.deltas is not None:
            deltas = stream.deltas.closing(result.text, cut=finish == "length")
            if self.tools.message(result.text, cut=finish == "length")[1] and finish == "stop":
                finish = "tool_calls"
        chunks = self._chunks(stream, index, deltas, result.logprobs)
        last = self._chunk({} if self.chat else "", finish, index, self._pending(stream, result.logprobs))
        return chunks + [{**last, "jacobi": jacobi_stats(result)}]

    def _stream(self, index: int) -> ChoiceStream:
        if index not in self.streams:
            self.streams[index] = ChoiceStream(deltas=None if self.tools is None else ToolDeltas(self.tools))
        return self.streams[index]

    def _chunks(
        self, stream: ChoiceStream, index: int, deltas: list, logprobs: list[TokenLogprob] | None
    ) -> list[dict]:
        """A chunk per delta, the first carrying the logprobs committed since the last chunk."""
        return [
            self._chunk(delta, None, index, self._pending(stream, logprobs) if i == 0 else None)
            for i, delta in enumerate(deltas)
        ]

    def _pending(self, stream: ChoiceStream, logprobs: list[TokenLogprob] | None) -> dict | None:
        """The logprobs object of `logprobs` past those already sent (marked sent)."""
        if logprobs is None:
            return None
        fresh = logprobs[stream.logprobs_sent :]
        if not fresh:
            return None
        stream.logprobs_sent += len(fresh)
        written = self._logprobs(fresh, stream.offset)
        if not self.chat:
            stream.offset += sum(map(len, written["tokens"]))
        return written

    def usage_chunk(self, results: list[GenerationResult]) -> dict:
        return {**self._head(self._chunk_object), "choices": [], "usage": usage(results)}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, content, finish: str | None, index: int = 0, logprobs: dict | None = None) -> dict:
        key = "delta" if self.chat else "text"
        choice = {"index": index, key: content, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head(self._chunk_object), "choices": [choice]}
