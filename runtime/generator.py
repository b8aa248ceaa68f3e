"""Generator: the public face of the runtime. Load an artifact once, generate from many threads."""

from __future__ import annotations

import time
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .backends.base import Backend
from .decoding import Progress, decode
from .errors import ContextLimitError, InputError
from .manifest import Manifest, load_manifest
from .proposers import ArmHistory, AutoProposer, JacobiProposer, LookaheadProposer, NoProposer, Proposer, UnionProposer
from .tokenizer import Detokenizer, Tokenizer
from .windows import AdaptiveWindow, FixedWindow

STRATEGIES = ("greedy", "jacobi", "lookahead", "speculative", "auto")
DEFAULT_WINDOW = 8  # the adaptive policy's Jacobi arm when no window is given
DEFAULT_GUESS_WINDOW = 16  # lookahead/speculative/auto: the widest pass; the proposers send only what pays
MAX_WINDOW = 64
PREFILL_CHUNK = 256


@dataclass
class Stats:
    strategy: str
    window: int  # the (largest) window of a pass
    adaptive: bool  # window picked per pass by measured speed (runtime.windows.AdaptiveWindow)
    prompt_tokens: int
    new_tokens: int
    finish_reason: str  # "eos", "stop", "length" (max_new_tokens) or "context" (max_context)
    prefill_passes: int
    target_passes: int  # decoding passes after the prefill
    tokens_per_pass: float  # tokens committed per decoding pass (greedy: 1.0); the prefill's token not counted
    wall_seconds: float
    prefill_seconds: float
    session_seconds: float  # time inside onnxruntime's run, prefill included
    overhead_share: float  # (wall - session) / wall: Python, bookkeeping, tokenizer
    decode_tokens_per_second: float  # new tokens / (wall - prefill)
    proposer: dict  # the proposer's counters: guesses proposed and accepted (by source), draft passes and time

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    ids: list[int]  # the new tokens (an EOS that ended generation included; a stop string's last token included)
    text: str  # the new text, special tokens skipped, cut before a stop string
    stats: Stats

    def to_dict(self) -> dict:
        return {"ids": self.ids, "text": self.text, "stats": self.stats.to_dict()}


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    strategy: str
    window: int
    adaptive: bool
    stop: list[str]


class TextStream:
    """Text pieces of one generation as they are committed (Generator.start()).

    `result` is None until the pieces are exhausted, then the GenerationResult. close() stops
    early (from the thread that iterates, between pieces): the backend context is released and
    `result` stays None."""

    def __init__(self, run: typing.Generator[str, None, GenerationResult], prompt_tokens: int):
        self._run = run
        self.prompt_tokens = prompt_tokens
        self.result: GenerationResult | None = None

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        while True:
            try:
                piece = next(self._run)
            except StopIteration as done:
                self.result = done.value
                raise StopIteration from None
            if piece:
                return piece

    def close(self) -> None:
        self._run.close()


class Generator:
    """A loaded artifact: `generate()` and `stream()` may be called from several threads at once;
    each call opens its own backend context (KV buffers and bindings)."""

    def __init__(self, backend: Backend, tokenizer: Tokenizer, prefill_chunk: int = PREFILL_CHUNK, draft: Backend | None = None):
        self.backend = backend
        self.manifest: Manifest = backend.manifest
        self.tokenizer = tokenizer
        self.prefill_chunk = prefill_chunk
        self.draft = draft  # a draft model's backend for speculative decoding (same vocabulary)
        self.arm_history = ArmHistory()  # `auto` remembers across calls which arms lost

    @classmethod
    def load(
        cls,
        path: str | Path,
        draft: str | Path | None = None,
        backend: str = "auto",
        threads: int | None = None,
        verify: bool = True,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> "Generator":
        """Validate the artifact at `path` (manifest, every file's sha256) and load it.

        draft: an artifact exported with `--role draft` (same vocabulary) for speculative decoding.
        backend: "auto" (CUDA when onnxruntime-gpu and a GPU are present, else CPU), "cpu" or "cuda"
        (onnxruntime), or "tensorrt" (the artifact's engine from `jacobi-rt build`, checked against
        this GPU and TensorRT version and its sha256; a draft needs its own engine).
        threads: onnxruntime intra-op threads; default the physical cores.
        """
        from .backends.onnxrt import OrtBackend

        if threads is not None and threads < 1:
            raise InputError(f"threads must be at least 1, not {threads}")
        if backend not in ("auto", "cpu", "cuda", "tensorrt"):
            raise InputError(f"backend must be auto, cpu, cuda or tensorrt, not {backend!r}")

        def open_backend(folder, manifest):
            if backend == "tensorrt":
                from .backends.tensorrt import TrtBackend

                return TrtBackend(folder, manifest, verify=verify)
            return OrtBackend(folder, manifest, backend, threads)

        manifest = load_manifest(path, verify=verify)
        tokenizer = Tokenizer(path, manifest)
        draft_backend = None
        if draft is not None:
            from .draft import check_draft

            draft_manifest = load_manifest(draft, verify=verify)
            check_draft(manifest, draft_manifest, path, draft)
            draft_backend = open_backend(draft, draft_manifest)
        return cls(open_backend(path, manifest), tokenizer, prefill_chunk, draft_backend)

    def chat_prompt(self, messages: list[dict]) -> str:
        """The chat template rendered for `messages`, ending with the assistant's turn."""
        return self.tokenizer.render_chat(messages, add_generation_prompt=True)

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int = 128,
        strategy: str = "auto",
        window: int | None = None,
        stop: str | Sequence[str] | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
    ) -> GenerationResult:
        """Generate up to max_new_tokens after `prompt` (text or token ids), or after chat `messages`.

        chat=True wraps a text prompt as one user message. Strategies: "greedy"; "jacobi" (with
        window=None it adapts each pass's window between 1 and 8 to the measured speed); "lookahead"
        (prompt lookup, an n-gram pool and the Jacobi trajectory, each guess sent only when its
        measured acceptance pays for the wider pass); "speculative" (the draft model); "auto" (the
        default: lookahead, plus the draft when one is loaded). `window` caps the widest pass. The
        result equals greedy decoding token for token, whatever the strategy and window.
        """
        pieces = self._run(self._request(prompt, messages, chat, max_new_tokens, strategy, window, stop))
        while True:
            try:
                next(pieces)
            except StopIteration as done:
                return done.value

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int = 128,
        strategy: str = "auto",
        window: int | None = None,
        stop: str | Sequence[str] | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
    ) -> Iterator[str]:
        """Like generate(), yielding text pieces as tokens are committed; they join to generate()'s text."""
        request = self._request(prompt, messages, chat, max_new_tokens, strategy, window, stop)
        return (piece for piece in self._run(request) if piece)

    def start(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int = 128,
        strategy: str = "auto",
        window: int | None = None,
        stop: str | Sequence[str] | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
    ) -> "TextStream":
        """Like stream(), but the returned TextStream also holds the GenerationResult (`.result`) once
        exhausted, and `close()` ends the generation early, freeing its KV buffers. The request is
        checked (and the prompt tokenized) now; nothing runs until the first piece is asked for."""
        request = self._request(prompt, messages, chat, max_new_tokens, strategy, window, stop)
        return TextStream(self._run(request), len(request.prompt_ids))

    # -- request checking -------------------------------------------------------------------

    def _request(self, prompt, messages, chat, max_new_tokens, strategy, window, stop) -> Request:
        if strategy not in STRATEGIES:
            raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
        return Request(
            prompt_ids=self._prompt_ids(prompt, messages, chat),
            max_new_tokens=int(max_new_tokens),
            strategy=strategy,
            window=self._window(strategy, window),
            adaptive=strategy == "jacobi" and window is None,
            stop=_stop_strings(stop),
        )

    def _prompt_ids(self, prompt, messages, chat) -> list[int]:
        if messages is not None:
            if prompt is not None:
                raise InputError("pass either a prompt or chat messages, not both")
            ids = self.tokenizer.encode(self.chat_prompt(messages), add_special_tokens=False)
        elif isinstance(prompt, str):
            if not prompt:
                raise InputError("the prompt is empty; pass some text or token ids")
            if chat:
                ids = self.tokenizer.encode(self.chat_prompt([{"role": "user", "content": prompt}]), add_special_tokens=False)
            else:
                ids = self.tokenizer.encode(prompt)
        elif prompt is None:
            raise InputError("nothing to generate from: pass a prompt (text or token ids) or chat messages")
        else:
            ids = _check_ids(prompt, self.manifest.architecture.vocab_size)
        if not ids:
            raise InputError("the prompt encodes to no tokens; pass some text or token ids")
        limit = self.manifest.max_context
        if len(ids) >= limit:
            raise ContextLimitError(
                f"the prompt has {len(ids)} tokens, but this artifact's context holds {limit} (prompt + output); "
                "shorten the prompt, or re-export with a larger --max-context if the model allows it"
            )
        return ids

    def _window(self, strategy: str, window) -> int:
        if window is not None and (not isinstance(window, (int, np.integer)) or isinstance(window, bool)):
            raise InputError(f"window must be an integer, not {window!r}")
        if strategy == "greedy":
            if window not in (None, 1):
                raise InputError(f"greedy decoding uses a window of 1, not {window}; use strategy='jacobi' for a larger window")
            return 1
        if strategy == "speculative" and self.draft is None:
            raise InputError("strategy 'speculative' needs a draft model: Generator.load(target, draft=DRAFT_DIR) "
                             "(export one with `jacobi-rt export MODEL --role draft`)")
        default = DEFAULT_WINDOW if strategy == "jacobi" else DEFAULT_GUESS_WINDOW
        window = default if window is None else int(window)
        if not 1 <= window <= MAX_WINDOW:
            raise InputError(f"window must be between 1 and {MAX_WINDOW} tokens, not {window}")
        return window

    # -- the run ----------------------------------------------------------------------------

    def _run(self, request: Request) -> Iterator[str]:
        """Yield text pieces; return the GenerationResult (StopIteration.value)."""
        started = time.perf_counter()
        progress = Progress()
        prompt = request.prompt_ids
        capacity = min(self.manifest.max_context, len(prompt) + request.max_new_tokens)
        proposer = self._proposer(request.strategy, capacity)
        eos = set(self.manifest.tokens.eos_ids)
        ids: list[int] = []
        text = _StopText(request.stop)
        detok = Detokenizer(self.tokenizer)
        with self.backend.context(capacity) as ctx, proposer:
            policy = AdaptiveWindow(request.window) if request.adaptive else FixedWindow(request.window)
            tokens = decode(ctx, prompt, proposer, policy, request.max_new_tokens,
                            self.manifest.max_context, eos, self.prefill_chunk, progress)
            for batch in tokens:
                for token in batch:
                    ids.append(token)
                    if token in eos:
                        break
                    yield text.add(detok.add(token))
                    if text.stopped:
                        progress.finish_reason = "stop"
                        break
                if text.stopped:
                    tokens.close()
                    break
            if not text.stopped:
                yield text.add(detok.flush())
                if text.stopped:
                    progress.finish_reason = "stop"
            yield text.finish()
            session = ctx.session_seconds
        return GenerationResult(ids, text.text, _stats(request, progress, len(ids), started, session, proposer.stats))

    def _proposer(self, strategy: str, capacity: int) -> Proposer:
        if strategy == "greedy":
            return NoProposer()
        if strategy == "jacobi":
            return JacobiProposer()
        if strategy == "lookahead" or (strategy == "auto" and self.draft is None):
            return LookaheadProposer()
        from .draft import DraftProposer

        if strategy == "speculative":
            return DraftProposer(self.draft, capacity)
        # the draft's chain plus one prompt-lookup/n-gram branch when it pays: copies stay cheap
        drafting = UnionProposer({"draft": DraftProposer(self.draft, capacity), "lookahead": LookaheadProposer(branches=1)})
        return AutoProposer({"lookahead": LookaheadProposer(), "draft": drafting}, history=self.arm_history)


def _stats(request: Request, progress: Progress, new_tokens: int, started: float, session: float, proposer: dict) -> Stats:
    wall = time.perf_counter() - started
    decode_seconds = max(wall - progress.prefill_seconds, 1e-9)
    return Stats(
        strategy=request.strategy,
        window=request.window,
        adaptive=request.adaptive,
        prompt_tokens=len(request.prompt_ids),
        new_tokens=new_tokens,
        finish_reason=progress.finish_reason,
        prefill_passes=progress.prefill_passes,
        target_passes=progress.target_passes,
        tokens_per_pass=round(progress.accepted / progress.target_passes, 3) if progress.target_passes else 0.0,
        wall_seconds=round(wall, 4),
        prefill_seconds=round(progress.prefill_seconds, 4),
        session_seconds=round(session, 4),
        overhead_share=round(max(wall - session, 0.0) / wall, 4) if wall > 0 else 0.0,
        decode_tokens_per_second=round(max(new_tokens - 1, 0) / decode_seconds, 2),
        proposer=dict(proposer),
    )


def _check_ids(prompt, vocab: int) -> list[int]:
    try:
        array = np.asarray(prompt)
    except (TypeError, ValueError) as exc:
        raise InputError(f"the prompt must be text or a flat list of token ids ({exc})") from exc
    if array.size == 0:
        raise InputError("the prompt is empty; pass some text or token ids")
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"token ids must be a flat list of integers, got an array of {array.dtype} with shape {list(array.shape)}")
    bad = array[(array < 0) | (array >= vocab)]
    if bad.size:
        raise InputError(f"token id {int(bad[0])} is outside this model's vocabulary (0..{vocab - 1}); "
                         "encode the text with this artifact's tokenizer")
    return array.tolist()


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise InputError(f"stop must be a non-empty string or a list of non-empty strings, not {stop!r}")
    return stops


class _StopText:
    """Accumulates text; finds stop strings; releases only text that cannot be the start of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, piece: str) -> str:
        if not piece or self.stopped:
            return ""
        begin = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [i for i in (self.text.find(s, begin) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self.hold)

    def finish(self) -> str:
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : upto], upto
        return piece
