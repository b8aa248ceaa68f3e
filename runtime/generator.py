"""Generator: the public face of the runtime. Load an artifact once, generate from many threads."""

from __future__ import annotations

import logging
import os
import queue
import time
import typing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .acceptance import AcceptanceTracker, PassCosts
from .backends.base import PREFILL_CHUNK, Backend, BackendLimits
from .config import DEFAULTS, DecodingConfig, changed_fields, dotted
from .constraints import GrammarTokenizer, Matcher, grammar_tokenizer
from .batcher import END, Batcher, Row, run_alone
from .errors import ContextLimitError, InputError
from .manifest import Manifest, load_manifest, verify_mode
from .params import STRATEGIES, GenerationParams, Overrides
from .prefix_cache import KeptContexts, PrefixCache
from .sampling import Sampler, SamplingParams, TokenLogprob, draw_seed
from .proposers import ArmHistory, AutoProposer, JacobiProposer, LookaheadProposer, NoProposer, Proposer, UnionProposer
from .scheduler import PassBudget
from .tokenizer import Detokenizer, Tokenizer
from .windows import AdaptiveWindow, FixedWindow

MAX_WINDOW = 64
DEFAULT_BATCH_CONTEXT = 2048  # a batcher's slot context on a graph whose attention reads the whole capacity
DEFAULT_SLOTS = 16  # the server's slots at most, unless asked: 16 rows of one token cost ~2.8 one-row passes on a CPU
DEFAULT_JACOBI_TAIL = DEFAULTS.draft.jacobi_tail


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
    seed: int | None = None  # the sampling seed (drawn when none was given); None when decoding greedily
    exactness: str = ""  # how this CPU keeps windows exact (runtime/backends/exact_rows.py): native, padded, greedy, ...
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache held (not prefilled)
    constraint: dict | None = None  # a constrained output's kind, mask seconds and rows, forced tokens sent and committed

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    ids: list[int]  # the new tokens (an EOS that ended generation included; a stop string's last token included)
    text: str  # the new text, special tokens skipped, cut before a stop string
    stats: Stats
    logprobs: list[TokenLogprob] | None = None  # one per id when the request asked for logprobs

    def to_dict(self) -> dict:
        out = {"ids": self.ids, "text": self.text, "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [asdict(lp) for lp in self.logprobs]
        return out


@dataclass
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    strategy: str
    window: int
    adaptive: bool
    stop: list[str]
    sampling: SamplingParams = SamplingParams()
    config: DecodingConfig = DEFAULTS  # the generator's, with the request's overrides (window, draft.jacobi_tail)
    exactness: str = ""  # the backend's exact_rows mode when the request was made
    matcher: Matcher | None = None  # the grammar's state for this request's output (params.constraint)


@dataclass
class Committed:
    """A generation's tokens as they are committed (the EOS that ends it included), with their logprobs
    when asked for: what a TextStream's reader can see between pieces (a stream's per-chunk logprobs)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # grows in step with ids, or ahead of it (the batcher's thread)


class TextStream:
    """Text pieces of one generation as they are committed (Generator.start()).

    `result` is None until the pieces are exhausted, then the GenerationResult. close() stops
    early (from the thread that iterates, between pieces): the backend context is released and
    `result` stays None. Iterating skips empty pieces; steps() does not, so a caller that must
    stop early (a cancelled request, a deadline) gets control after every decoding pass."""

    def __init__(self, run: typing.Generator[str, None, GenerationResult], prompt_tokens: int,
                 committed: Committed | None = None):
        self._run = run
        self.prompt_tokens = prompt_tokens
        self.committed = committed or Committed()  # after each piece: the tokens committed up to it
        self.result: GenerationResult | None = None

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        for piece in self.steps():
            if piece:
                return piece
        raise StopIteration

    def steps(self) -> Iterator[str]:
        """One piece per committed token, "" included (text held back for a stop string, special
        tokens): at least one per decoding pass, whatever the text."""
        while True:
            try:
                piece = next(self._run)
            except StopIteration as done:
                self.result = self.result or done.value  # an exhausted generator stops again with None
                return
            yield piece

    def close(self) -> None:
        self._run.close()


class Generator:
    """A loaded artifact: `generate()` and `stream()` may be called from several threads at once;
    each call opens its own backend context (KV buffers and bindings)."""

    def __init__(self, backend: Backend, tokenizer: Tokenizer, prefill_chunk: int | None = None, draft: Backend | None = None,
                 config: DecodingConfig | Mapping[str, Any] | None = None, prefix_cache: bool = True):
        self.backend = backend
        self.manifest: Manifest = backend.manifest
        self.tokenizer = tokenizer
        overrides = {} if prefill_chunk is None else {"batch.prefill_chunk": prefill_chunk}  # the argument maps onto the config
        self.config = DEFAULTS.with_overrides(config).with_overrides(overrides)
        self.prefill_chunk = self.config.batch.prefill_chunk or PREFILL_CHUNK
        self.draft = draft  # a draft model's backend for speculative decoding (same vocabulary)
        self.arm_history = ArmHistory(self.config.auto.max_sit_out)  # `auto` remembers across calls which arms lost
        self.batcher: Batcher | None = None  # start_batching(): every call shares its passes
        # The prefix cache (runtime/prefix_cache.py): a batcher's idle slots keep what finished rows wrote,
        # and lone calls keep their contexts, so the next turn of a conversation prefills only what is new.
        self.prefix_cache = prefix_cache
        self.kept = KeptContexts(self.config.prefix_cache if prefix_cache else None)
        if not backend.rows.exact_windows:
            logging.getLogger("jacobi_rt").warning("%s (%s)", backend.rows.line(), self.manifest.source.get("name", "artifact"))

    @property
    def limits(self) -> BackendLimits:
        """The backend's context, prefill chunk and widest pass (a TensorRT engine's profiles may allow
        less than the manifest); the prefill chunk is also capped by this Generator's prefill_chunk."""
        limits = self.backend.limits
        context = limits.max_context if self.batcher is None else min(limits.max_context, self.batcher.capacity)
        return replace(limits, max_context=context, prefill_chunk=min(self.prefill_chunk, limits.prefill_chunk))

    @classmethod
    def load(
        cls,
        path: str | Path,
        draft: str | Path | None = None,
        backend: str = "auto",
        threads: int | None = None,
        verify: bool | str = "sampled",
        prefill_chunk: int | None = None,
        graph: str = "auto",
        config: DecodingConfig | Mapping[str, Any] | None = None,
        prefix_cache: bool = True,
    ) -> "Generator":
        """Validate the artifact at `path` (its manifest and files) and load it.

        verify: how its files are checked against the manifest (runtime/file_digest.py): "sampled" (the
        default; True): each file's size and a digest of 64 blocks of 64 KiB, a few MB read whatever the
        size -- a change outside those blocks is not seen, only by "full"; "full": every byte's sha256
        (what `jacobi-rt verify DIR` runs); "none" (False): no check. Files of manifests written before
        the sampled digests get the full check.

        draft: an artifact exported with `--role draft` (same vocabulary) for speculative decoding.
        backend: "auto" (CUDA when onnxruntime-gpu and a GPU are present, else CPU), "cpu" or "cuda"
        (onnxruntime), or "tensorrt" (the artifact's engine from `jacobi-rt build`, checked against
        this GPU and TensorRT version and its sha256; a draft needs its own engine).
        threads: onnxruntime intra-op threads; default the physical cores.
        graph: onnxruntime's graph variant: "auto" (the in-place cache on the CPU when the artifact has
        it), "inplace" or "portable" (the target and the draft alike).
        config: the generator's DecodingConfig (runtime.config), or a mapping of the fields to change;
        prefill_chunk is its field of that name.
        prefix_cache: keep what finished generations computed (their KV, n-gram pool and draft cache) for
        the next request that shares its prompt's prefix (runtime/prefix_cache.py); False: prefill every
        prompt whole.
        """
        from .backends.onnxrt import OrtBackend

        if threads is not None and threads < 1:
            raise InputError(f"threads must be at least 1, not {threads}")
        if backend not in ("auto", "cpu", "cuda", "tensorrt"):
            raise InputError(f"backend must be auto, cpu, cuda or tensorrt, not {backend!r}")
        decoding = DEFAULTS.with_overrides(config)  # checked before the (slow) loading
        verify = verify_mode(verify)

        def open_backend(folder, manifest):
            if backend == "tensorrt":
                from .backends.tensorrt import TrtBackend

                return TrtBackend(folder, manifest, verify=verify != "none")
            return OrtBackend(folder, manifest, backend, threads, graph)

        manifest = load_manifest(path, verify=verify)
        tokenizer = Tokenizer(path, manifest)
        draft_backend = None
        if draft is not None:
            from .draft import check_draft

            draft_manifest = load_manifest(draft, verify=verify)
            check_draft(manifest, draft_manifest, path, draft)
            draft_backend = open_backend(draft, draft_manifest)
        return cls(open_backend(path, manifest), tokenizer, prefill_chunk, draft_backend, decoding, prefix_cache)

    def chat_prompt(self, messages: list[dict]) -> str:
        """The chat template rendered for `messages`, ending with the assistant's turn."""
        return self.tokenizer.render_chat(messages, add_generation_prompt=True)

    def generate(self, prompt: str | Sequence[int] | None = None, max_new_tokens: int | None = None, *,
                 params: GenerationParams | None = None, messages: list[dict] | None = None, chat: bool = False,
                 **options) -> GenerationResult:
        """Generate up to max_new_tokens after `prompt` (text or token ids), or after chat `messages`.

        params: the request (runtime.params.GenerationParams); `max_new_tokens` and `options` change its
        fields: strategy, window, stop, jacobi_tail, config, and SamplingParams' fields (temperature, top_k,
        top_p, min_p, seed, penalties, logprobs=N). chat=True wraps a text prompt as one user message.

        Strategies: "greedy"; "jacobi" (with no window it adapts each pass's window between 1 and 8 to the
        measured speed); "lookahead" (prompt lookup, an n-gram pool and the Jacobi trajectory, each guess
        sent only when its measured acceptance pays for the wider pass); "speculative" (the draft model);
        "auto" (the default: lookahead, plus the draft when one is loaded). `window` caps the widest pass;
        jacobi_tail (speculative, auto's draft arm): the target's predictions past the first rejected guess
        seed the draft's next window. config: the call's decoding tuning (runtime.config.DecodingConfig, or a
        mapping of the fields to change; LOAD_FIELDS are refused here). response_format (OpenAI's dict) or
        constraint (runtime.constraints.Constraint): the output follows a JSON schema, a regex, a choice or a
        grammar, the grammar's forced tokens sent as guesses; one that cannot finish within max_new_tokens
        ends with finish_reason "length" (Stats.constraint["complete"] False). The tokens are those of
        strategy="greedy" (one token a pass) with the same sampling, whatever the strategy and options;
        temperature > 0 samples (seed drawn when left out: Stats.seed).
        """
        return _drain(self._run(self._request(prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options))))

    def stream(self, prompt: str | Sequence[int] | None = None, max_new_tokens: int | None = None, *,
               params: GenerationParams | None = None, messages: list[dict] | None = None, chat: bool = False,
               **options) -> Iterator[str]:
        """Like generate(), yielding text pieces as tokens are committed; they join to generate()'s text."""
        request = self._request(prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options))
        return (piece for piece in self._run(request) if piece)

    def start(self, prompt: str | Sequence[int] | None = None, max_new_tokens: int | None = None, *,
              params: GenerationParams | None = None, messages: list[dict] | None = None, chat: bool = False,
              **options) -> "TextStream":
        """Like stream(), but the returned TextStream also holds the GenerationResult (`.result`) once
        exhausted, and `close()` ends the generation early, freeing its slot. The request is checked (and
        the prompt tokenized) now; nothing runs until the first piece is asked for."""
        request = self._request(prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options))
        committed = Committed()
        return TextStream(self._run(request, committed), len(request.prompt_ids), committed)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int | None = None, *,
                       params: GenerationParams | None = None, chat: bool = False,
                       **options) -> list[GenerationResult | InputError]:
        """generate() for many prompts at once, sharing every pass (on the batcher of start_batching(), else on
        one opened for this call with a slot per prompt, at most 16; one slot where the backend's contexts
        hold one row). Each prompt is checked alone: one that is invalid (e.g. over the context) gets its
        InputError in its place; the others complete."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InputError("generate_batch() takes a list of prompts (texts or token id lists); use generate() for one")
        params = GenerationParams.of(params, max_new_tokens=max_new_tokens, **options)
        requests: list[Request | InputError] = []
        for prompt in prompts:
            try:
                requests.append(self._request(prompt, None, chat, params))
            except InputError as exc:
                requests.append(exc)
        valid = [r for r in requests if isinstance(r, Request)]
        slots = max(1, min(len(valid), 16)) if self.backend.batched else 1
        batcher = self.batcher or self._batcher(slots)
        try:
            runs = [self._on_batcher(batcher, r) for r in valid]
            if batcher is not self.batcher:
                while any(not row.finished for row, _ in runs):
                    batcher.step()
            results = iter([_drain(pieces) for _, pieces in runs])
        finally:
            if batcher is not self.batcher:
                batcher.close()
        return [next(results) if isinstance(r, Request) else r for r in requests]

    def start_batching(self, slots: int | None = None, capacity: int | None = None, batched_draft: bool = True) -> Batcher:
        """From now on, run every generation on one batcher of `slots` rows (continuous batching: a background
        thread runs passes shared by all running generations). slots: default `default_slots()`; more than
        one needs the in-place graph (rows of their own lengths).

        capacity: each row's context (prompt + output); while the batcher runs, `limits.max_context` is
        this capacity. Default: the artifact's, except that the in-place graph's `scatter` attention
        (where GroupQueryAttention refuses the head size) reads the whole capacity every pass (16 rows
        of one token, SmolLM2: 148 ms at capacity 256, 237 at 2048, 495 at 8192), so it is capped at
        DEFAULT_BATCH_CONTEXT there.

        batched_draft: the drafting rows share one slotted draft context, one batched draft pass a step
        (runtime.draft_slots; a draft of the in-place graph); False: each row's draft runs its own passes."""
        if self.batcher is not None:
            raise InputError("this Generator already runs a batcher; stop_batching() first")
        if capacity is None and self.manifest.inplace_attention == "scatter" and self.backend.batched:
            capacity = min(self.limits.max_context, DEFAULT_BATCH_CONTEXT)
        self.batcher = self._batcher(self.default_slots() if slots is None else slots, capacity, batched_draft).start()
        return self.batcher

    def default_slots(self, memory_share: float = 0.25) -> int:
        """The batcher's slots when none are asked for: 1 where a context holds one row; else as many rows as
        fill `memory_share` of the available memory with their KV caches at the batch context, between 1 and
        DEFAULT_SLOTS (a CPU pass of more rows costs more than they gain: tools/load_bench.py)."""
        if not self.backend.batched:
            return 1
        arch = self.manifest.architecture
        capacity = min(self.limits.max_context, DEFAULT_BATCH_CONTEXT)
        row_bytes = 2 * arch.num_layers * arch.kv_heads * arch.head_dim * capacity * (4 if self.manifest.dtype == "float32" else 2)
        return max(1, min(DEFAULT_SLOTS, int(available_memory() * memory_share // row_bytes)))

    def _batcher(self, slots: int, capacity: int | None = None, batched_draft: bool = True) -> Batcher:
        """A batcher of `slots` rows on this generator's config (prefill chunk, batched prefill budget, cost prior)."""
        chunk = self.limits.prefill_chunk
        cache = PrefixCache(self.prefix_cache, self.config.prefix_cache)
        return Batcher.open(self.backend, slots, capacity, prefill_chunk=chunk, budget=PassBudget.of(self.config, chunk),
                           cache=cache, draft=self.draft if batched_draft else None)

    def stop_batching(self) -> None:
        batcher, self.batcher = self.batcher, None
        if batcher is not None:
            batcher.close()

    def close(self) -> None:
        """Stop the batcher and release what the prefix cache keeps (lone calls' contexts, drafts' caches);
        the Generator stays usable."""
        self.stop_batching()
        self.kept.close()

    # -- request checking -------------------------------------------------------------------

    def _request(self, prompt, messages, chat: bool, params: GenerationParams) -> Request:
        """The request resolved against this generator: the prompt's ids, the window, the config."""
        overrides = self._overrides(params.config)
        decoding = self.config.with_overrides(overrides, per_request=True)  # checked, window and jacobi_tail too
        # A request's window or jacobi_tail, as an argument or in its config, is the request's own choice.
        window, jacobi_tail = params.window, params.jacobi_tail
        if window is None and "window" in overrides:
            window = decoding.window
        if jacobi_tail is None and "draft.jacobi_tail" in overrides:
            jacobi_tail = decoding.draft.jacobi_tail
        strategy = params.strategy
        if not self.backend.rows.exact_windows:  # no window is exact on this CPU (exact_rows.py): decode greedily
            strategy, window, jacobi_tail = "greedy", None, None
        adaptive = strategy == "jacobi" and window is None and decoding.window is None
        window = self._window(strategy, window, decoding)
        tail = self._jacobi_tail(strategy, jacobi_tail, decoding)
        sampling = params.sampling
        if sampling.sampled and sampling.seed is None:
            sampling = sampling.with_seed(draw_seed())
        return Request(
            prompt_ids=self._prompt_ids(prompt, messages, chat),
            max_new_tokens=params.max_new_tokens,
            strategy=strategy,
            window=window,
            adaptive=adaptive,
            stop=list(params.stop),
            sampling=sampling,
            config=replace(decoding, window=window, draft=replace(decoding.draft, jacobi_tail=tail)),
            exactness=self.backend.rows.mode,
            matcher=None if params.constraint is None else self.grammars().matcher(params.constraint),
        )

    def grammars(self) -> GrammarTokenizer:
        """llguidance's view of this artifact's vocabulary (runtime.constraints), built on first use
        (~0.3 s for 49,152 tokens) and shared by every constrained request."""
        return grammar_tokenizer(self.tokenizer, self.manifest.architecture.vocab_size, self.manifest.tokens.eos_ids)

    def _overrides(self, config: Overrides) -> dict[str, Any]:
        """A request's config as the fields it changes from this generator's."""
        if config is None:
            return {}
        if isinstance(config, DecodingConfig):
            return changed_fields(self.config, config)
        return dotted(config)

    def _jacobi_tail(self, strategy: str, jacobi_tail, decoding: DecodingConfig) -> bool:
        """The request's jacobi_tail (checked: it belongs to the draft's chain), else the config's."""
        if jacobi_tail is None:
            return decoding.draft.jacobi_tail
        if strategy not in ("speculative", "auto") or self.draft is None:
            raise InputError("jacobi_tail is an option of the draft model's chain: use strategy 'speculative' "
                             "(or 'auto') with a draft model, or leave jacobi_tail out")
        return bool(jacobi_tail)

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
        limit = self.limits.max_context
        if len(ids) >= limit:
            where = "this artifact's context" if limit == self.manifest.max_context else f"the {self.backend.name} engine's context"
            raise ContextLimitError(
                f"the prompt has {len(ids)} tokens, but {where} holds {limit} (prompt + output); shorten the prompt, "
                "or re-export (or rebuild the engine) with a larger max_context if the model allows it"
            )
        return ids

    def _window(self, strategy: str, window, decoding: DecodingConfig) -> int:
        """The request's window (checked), else the config's, else the strategy's default from the config."""
        if strategy == "greedy":
            if window not in (None, 1):
                raise InputError(f"greedy decoding uses a window of 1, not {window}; use strategy='jacobi' for a larger window")
            return 1
        if strategy == "speculative" and self.draft is None:
            raise InputError("strategy 'speculative' needs a draft model: Generator.load(target, draft=DRAFT_DIR) "
                             "(export one with `jacobi-rt export MODEL --role draft`)")
        widest = min(MAX_WINDOW, self.limits.max_window)
        default = decoding.window or (decoding.jacobi.window if strategy == "jacobi" else decoding.guess_window)
        window = min(default, widest) if window is None else int(window)
        if not 1 <= window <= widest:
            raise InputError(f"window must be between 1 and {widest} tokens on this backend ({self.backend.name}), not {window}")
        return window

    # -- the run ----------------------------------------------------------------------------

    def _run(self, request: Request, committed: Committed | None = None) -> Iterator[str]:
        """Yield text pieces; return the GenerationResult (StopIteration.value). A lone call (no batcher
        started) is a one-row batch run in this thread on a context sized to it."""
        if self.batcher is not None:
            _, pieces = self._on_batcher(self.batcher, request, committed)
            return (yield from pieces)
        started = time.perf_counter()
        capacity = min(self.limits.max_context, len(request.prompt_ids) + request.max_new_tokens)
        # The target's context first (a kept one when the prompt continues a kept conversation): a
        # proposer's own cache (a draft's) is opened only once it exists.
        ctx, cache = self.kept.take(request.prompt_ids, capacity, self.backend.context)
        try:
            row = self._row(request, capacity, self.limits.max_context)
            chunk = self.limits.prefill_chunk
            batches = run_alone(ctx, row, chunk, PassBudget.of(request.config, chunk), cache=cache)
            return (yield from self._pieces(row, request, batches, started, committed))
        finally:
            self.kept.put(ctx, cache)  # kept for the next turn, or closed

    def _on_batcher(self, batcher: Batcher, request: Request, committed: Committed | None = None) -> tuple[Row, Iterator[str]]:
        """Queue `request` on the batcher now; the pieces come from the returned generator ("" every 50 ms
        while it waits, so a caller can stop it); closing that generator cancels the row."""
        started = time.perf_counter()
        max_context = min(self.limits.max_context, batcher.capacity)
        capacity = min(max_context, len(request.prompt_ids) + request.max_new_tokens)
        row = batcher.submit(self._row(request, capacity, max_context))

        def batches() -> Iterator[list[int]]:
            try:
                while True:
                    try:
                        batch = row.tokens.get(timeout=0.05)
                    except queue.Empty:
                        yield []
                        continue
                    if batch is END:
                        break
                    yield batch
            finally:
                batcher.cancel(row)  # a no-op for a finished row; frees the slot of one stopped early
            if row.error is not None:
                raise row.error

        return row, self._pieces(row, request, batches(), started, committed)

    def _row(self, request: Request, capacity: int, max_context: int) -> Row:
        sampler = Sampler(request.sampling, len(request.prompt_ids))
        # each pass's window: adaptive between 1 and the window for plain Jacobi without a window, else fixed
        policy = AdaptiveWindow(request.window, request.config.jacobi) if request.adaptive else FixedWindow(request.window)
        return Row(request.prompt_ids, request.max_new_tokens, self._proposer(request, capacity), sampler,
                   policy, set(self.manifest.tokens.eos_ids), max_context, request.matcher)

    def _pieces(self, row: Row, request: Request, batches: Iterator[list[int]], started: float,
                committed: Committed | None = None) -> Iterator[str]:
        """The row's text pieces ("" for a pass without text, so a caller can stop between passes); ends at
        EOS, the row's end or a stop string; returns the GenerationResult. `committed` follows the tokens."""
        committed = committed or Committed()
        committed.logprobs = row.sampler.logprobs if request.sampling.logprobs is not None else None
        eos, ids = row.eos_ids, committed.ids
        text, detok = _StopText(request.stop), Detokenizer(self.tokenizer)
        try:
            for batch in batches:
                yield from _pass_texts(batch, ids, eos, text, detok)
                if text.stopped:
                    break
        finally:
            batches.close()  # ends the row at once when the caller or a stop string stops early
        yield from _closing_texts(text, detok)
        return _result(request, row, ids, started, text)

    def _proposer(self, request: Request, capacity: int) -> Proposer:
        """The strategy's proposer, tuned by the request's config; where the backend's windows may not
        branch (BackendLimits.branches), every proposer sends one chain a pass."""
        strategy, config = request.strategy, request.config
        branches = self.limits.branches
        costs = PassCosts(config.costs)  # the request's one target cost curve, read by all its proposers

        def lookahead(most: int = config.lookahead.branches) -> LookaheadProposer:
            return LookaheadProposer(most if branches else 1, AcceptanceTracker(costs, config.lookahead))

        if strategy == "greedy":
            return NoProposer()
        if strategy == "jacobi":
            return JacobiProposer(AcceptanceTracker(costs, config.lookahead))
        if strategy == "lookahead" or (strategy == "auto" and self.draft is None):
            return lookahead()
        from .draft import DraftLength, DraftProposer

        def draft() -> DraftProposer:
            chunk = min(self.prefill_chunk, self.draft.limits.prefill_chunk)
            return DraftProposer(self.draft, capacity, config.draft, prefill_chunk=chunk,
                                 length=DraftLength(costs, config.draft), max_window=self.draft.limits.max_window)

        if strategy == "speculative":
            return draft()
        auto = dict(config=config.auto, history=self.arm_history)
        if not branches:
            return AutoProposer({"lookahead": lookahead(1), "draft": draft()}, **auto)
        # the draft's chain plus one prompt-lookup/n-gram branch when it pays: copies stay cheap
        drafting = UnionProposer({"draft": draft(), "lookahead": lookahead(1)})
        return AutoProposer({"lookahead": lookahead(), "draft": drafting}, **auto)


def available_memory() -> int:
    """Bytes of memory available to new allocations (MemAvailable), or the physical memory where unknown."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _drain(pieces: Iterator[str]) -> GenerationResult:
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value


def _pass_texts(batch: list[int], ids: list[int], eos: set[int], text: "_StopText", detok: Detokenizer) -> Iterator[str]:
    """One pass's committed tokens as text pieces ("" for a pass without tokens, so the caller can
    stop between passes); ends at EOS (kept in `ids`) or when a stop string completes."""
    if not batch:
        yield ""
    for token in batch:
        ids.append(token)
        if token in eos:
            return
        yield text.add(detok.add(token))
        if text.stopped:
            return


def _closing_texts(text: "_StopText", detok: Detokenizer) -> Iterator[str]:
    """What the detokenizer and the stop-string hold back, once the tokens have ended."""
    if not text.stopped:
        yield text.add(detok.flush())
    yield text.finish()


def _result(request: Request, row: Row, ids: list[int], started: float, text: "_StopText") -> GenerationResult:
    wall = time.perf_counter() - started
    progress, session, sampling = row.progress, row.session_seconds, row.sampler.params
    decode_seconds = max(wall - progress.prefill_seconds, 1e-9)
    stats = Stats(
        strategy=request.strategy,
        window=request.window,
        adaptive=request.adaptive,
        prompt_tokens=len(request.prompt_ids),
        new_tokens=len(ids),
        finish_reason="stop" if text.stopped else progress.finish_reason,
        prefill_passes=progress.prefill_passes,
        target_passes=progress.target_passes,
        tokens_per_pass=round(progress.accepted / progress.target_passes, 3) if progress.target_passes else 0.0,
        wall_seconds=round(wall, 4),
        prefill_seconds=round(progress.prefill_seconds, 4),
        session_seconds=round(session, 4),
        overhead_share=round(max(wall - session, 0.0) / wall, 4) if wall > 0 else 0.0,
        decode_tokens_per_second=round(max(len(ids) - 1, 0) / decode_seconds, 2),
        proposer=dict(row.proposer.stats),
        seed=sampling.seed if sampling.sampled else None,
        exactness=request.exactness,
        cached_tokens=row.cached,
        constraint=None if row.matcher is None else _constraint_stats(row.matcher),
    )
    logprobs = row.sampler.logprobs[: len(ids)] if request.sampling.logprobs is not None else None
    return GenerationResult(ids, text.text, stats, logprobs)


def _constraint_stats(matcher: Matcher) -> dict:
    cost = matcher.cost
    return {"mask_seconds": round(cost.seconds, 6), "mask_rows": cost.rows, "forced_sent": cost.forced_sent,
            "forced_committed": cost.forced_committed, "past_forced_sent": cost.past_forced_sent, "complete": matcher.can_stop}


def _check_ids(prompt, vocab: int) -> list[int]:
    try:
        array = np.asarray(prompt)
    except (TypeError, ValueError) as exc:
        raise InputError(f"the prompt must be text or a flat list of token ids ({exc})") from exc
    if array.size == 0:
        raise InputError("the prompt is empty; pass some text or token ids")
    ints = array.ndim == 1 and all(type(t) is int for t in array.tolist())  # tolist: numpy ints become int, bools bool
    if not ints:
        raise InputError(f"token ids must be a flat list of integers, got an array of {array.dtype} with shape {list(array.shape)}")
    bad = [t for t in array.tolist() if not 0 <= t < vocab]  # Python ints: 2**70 too (numpy holds it as an object)
    if bad:
        raise InputError(f"token id {bad[0]} is outside this model's vocabulary (0..{vocab - 1}); "
                         "encode the text with this artifact's tokenizer")
    return array.tolist()


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
