"""How each endpoint writes its answer: a whole JSON object, or server-sent-event chunks in OpenAI's format.

A stream is: (chat only) a chunk with the assistant's role, one chunk per text piece, a chunk with
`finish_reason` and the `jacobi` stats (per choice when n > 1; it carries the choice's logprobs when
asked for, since pieces and tokens do not map one to one), a usage chunk (`choices: []`) when the request set
`stream_options.include_usage`, then `data: [DONE]`. A stream that fails after it began (the
request timed out, the runtime failed) sends `data: {"error": {...}}` and then `data: [DONE]`.
A reply presented as tool calls (`ToolCalls`) sends empty deltas for its pieces and the calls whole in
its closing chunk (finish_reason "tool_calls"), since a call exists only once its output parses.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from jacobi_rt.runtime.generator import GenerationResult

# the runtime's finish reasons -> OpenAI's ("context": the model's context was full)
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


@dataclass(frozen=True)
class ToolCalls:
    """How a chat reply with tools is presented: as OpenAI's `tool_calls` where the output is a call.

    name: the named function (tool_choice {"type": "function", ...}): the output is its arguments
    object. None (tool_choice "required"): the output is a JSON array of {"name", "arguments"}.
    tags (tool_choice "auto", where the chat template renders the tools): the output is free text, a
    call being a JSON {"name", "arguments"} object between the two tags the template announced
    (`names`: the functions offered); the text before the first call is the message's content.
    An output cut short (finish "length") is presented as OpenAI presents it: the calls begun, the last one's
    arguments the JSON text written so far (`partial`); a call whose name is not yet written is left out
    unless the name's beginning picks one offered function.
    """

    name: str | None
    tags: tuple[str, str] | None = None
    names: tuple[str, ...] = ()
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only ("required" is held to one by its grammar)

    def calls(self, text: str) -> list[dict] | None:
        """OpenAI's tool_calls for a finished output (None when it does not parse: cut short, or plain text)."""
        try:
            if self.tags is not None:
                pairs = self._tagged(text)
                if not pairs:
                    return None
            elif self.name is not None:
                json.loads(text)
                pairs = [(self.name, text)]
            else:
                pairs = [(call["name"], json.dumps(call["arguments"], ensure_ascii=False)) for call in json.loads(text)]
        except (ValueError, TypeError, KeyError):
            return None
        if not self.parallel:
            pairs = pairs[:1]
        return [{"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
                for name, arguments in pairs]

    def partial(self, text: str) -> list[dict]:
        """OpenAI's tool_calls for an output cut short: each call begun, the last one's arguments unfinished."""
        if self.name is not None:
            pairs = [(self.name, text)]
        elif self.tags is not None:
            blocks = text.split(self.tags[0])[1:]
            pairs = [pair for block in blocks for pair in self._begun(block.split(self.tags[1], 1)[0])]
        else:
            pairs = self._begun(text.lstrip()[1:])  # the array's calls, one after another
        return [{"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
                for name, arguments in (pairs if self.parallel else pairs[:1])]

    def _begun(self, text: str) -> list[tuple[str, str]]:
        """(name, arguments text) of each {"name": ..., "arguments": ...} object begun in `text` (the grammar
        writes name first); a complete object's arguments re-serialized, the last one's as written."""
        pairs, starts = [], set()
        for start in _CALL_START.finditer(text):
            starts.add(start.start())
            name = self._named(start.group(1))
            if name is None:
                continue
            rest = text[start.end():]
            try:
                arguments, _ = json.JSONDecoder().raw_decode(rest)
                pairs.append((name, json.dumps(arguments, ensure_ascii=False)))
            except ValueError:
                pairs.append((name, rest))
        cut = _CUT_NAME.search(text)
        if cut and cut.start() not in starts and (name := self._named(cut.group(1), partial=True)) is not None:
            pairs.append((name, ""))
        return pairs

    def _named(self, written: str, partial: bool = False) -> str | None:
        if not partial:
            return written if not self.names or written in self.names else None
        matching = [n for n in self.names if n.startswith(written)]
        return matching[0] if len(matching) == 1 else None

    def content(self, text: str) -> str | None:
        """The message's content beside its calls: the text before the first call ("auto"), else none."""
        if self.tags is None:
            return None
        return text.split(self.tags[0], 1)[0].strip() or None

    def _tagged(self, text: str) -> list[tuple[str, str]]:
        """(name, arguments JSON) of each tagged call; a block that is no call of an offered function raises ValueError."""
        opening, closing = self.tags
        pairs = []
        for block in re.findall(re.escape(opening) + r"(.*?)" + re.escape(closing), text, re.S):
            call = json.loads(block)
            if not isinstance(call, dict) or call.get("name") not in self.names:
                raise ValueError(f"not a call of one of the tools: {block[:80]!r}")
            arguments = call.get("arguments", call.get("parameters"))
            if not isinstance(arguments, dict):
                raise ValueError(f"not a call of one of the tools: {block[:80]!r}")
            pairs.append((call["name"], json.dumps(arguments, ensure_ascii=False)))
        return pairs


_CALL_START = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_CUT_NAME = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]*)(?:"[\s,":a-z]*)?$')  # cut in or just after a name


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
DONE = b"data: [DONE]\n\n"


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def usage(results: list[GenerationResult]) -> dict:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache held (the first choice's)."""
    prompt, completion = results[0].stats.prompt_tokens, sum(r.stats.new_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": results[0].stats.cached_tokens}}


def jacobi_stats(result: GenerationResult, seeds: list[int | None] | None = None) -> dict:
    """jacobi-rt's extension field: how the answer was decoded (the text is the same whatever the
    strategy) and the sampling seed (drawn when the request gave none), to reproduce it."""
    s = result.stats
    stats = {"strategy": s.strategy, "window": s.window, "adaptive": s.adaptive, "target_passes": s.target_passes,
             "tokens_per_pass": s.tokens_per_pass, "prefill_passes": s.prefill_passes,
             "decode_tokens_per_second": s.decode_tokens_per_second, "wall_seconds": s.wall_seconds,
             "finish_reason": s.finish_reason, "seed": s.seed}
    if seeds is not None and len(seeds) > 1:
        stats["seeds"] = seeds  # choice i's seed
    if s.constraint is not None:  # a constrained output: its masks' seconds and rows, forced tokens sent and committed
        stats["constraint"] = s.constraint
    return stats


@dataclass
class Reply:
    """One response's identity and shape; `chat` picks chat.completion(.chunk) over text_completion."""

    model: str
    chat: bool
    token_text: Callable[[int], str] = str  # a token id's text, for logprobs
    tools: ToolCalls | None = None  # chat with tool_choice: the output is presented as tool calls
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]

    def whole(self, results: list[GenerationResult]) -> dict:
        choices = []
        for index, result in enumerate(results):
            finish = FINISH_REASONS[result.stats.finish_reason]
            calls = self._calls(result)
            if calls:
                finish = "tool_calls" if finish == "stop" else finish
                choice = {"index": index, "message": {"role": "assistant", "content": self.tools.content(result.text),
                                                      "tool_calls": calls}}
            elif self.tools is not None and self.tools.tags is None:  # cut before any call began: no wrapper as text
                choice = {"index": index, "message": {"role": "assistant", "content": None}}
            elif self.chat:
                choice = {"index": index, "message": {"role": "assistant", "content": result.text}}
            else:
                choice = {"index": index, "text": result.text}
            choices.append({**choice, "logprobs": self.logprobs(result), "finish_reason": finish})
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": usage(results), "jacobi": jacobi_stats(results[0], [r.stats.seed for r in results])}

    def _calls(self, result: GenerationResult) -> list[dict] | None:
        if self.tools is None:
            return None
        if FINISH_REASONS[result.stats.finish_reason] == "length" and (self.tools.tags is None or self.tools.tags[0] in result.text):
            return self.tools.partial(result.text) or None  # cut short: the calls begun ("auto": only where one began)
        return self.tools.calls(result.text)

    def logprobs(self, result: GenerationResult) -> dict | None:
        """OpenAI's logprobs object: chat's {"content": [...]}, or completions' four parallel lists."""
        if result.logprobs is None:
            return None
        if self.chat:
            return {"content": [{**self._token(lp.token, lp.logprob), "top_logprobs": [self._token(i, v) for i, v in lp.top]}
                                for lp in result.logprobs]}
        tokens = [self.token_text(lp.token) for lp in result.logprobs]
        offsets = [sum(map(len, tokens[:i])) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in result.logprobs],
                "top_logprobs": [{self.token_text(i): v for i, v in lp.top} for lp in result.logprobs],
                "text_offset": offsets}

    def _token(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def opening(self, n: int = 1) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None, i) for i in range(n)] if self.chat else []

    def piece(self, text: str, index: int = 0) -> dict:
        if self.tools is not None:  # tool calls are sent whole in the closing chunk, once the output parses
            return self._chunk({}, None, index)
        return self._chunk({"content": text} if self.chat else text, None, index)

    def closing(self, result: GenerationResult, index: int = 0) -> dict:
        finish = FINISH_REASONS[result.stats.finish_reason]
        delta: dict | str = {} if self.chat else ""
        if self.tools is not None:
            calls = self._calls(result)
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]} if calls else \
                {} if self.tools.tags is None else {"content": result.text}
            if calls and self.tools.content(result.text):
                delta = {"content": self.tools.content(result.text), **delta}
            finish = "tool_calls" if calls and finish == "stop" else finish
        chunk = self._chunk(delta, finish, index, self.logprobs(result))
        return {**chunk, "jacobi": jacobi_stats(result)}

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
