"""Generator: the public face of the runtime. Load an artifact once, generate from many threads.

It loads (the backend, the tokenizer, a draft) and holds the public calls; each call delegates in
one direction: the request is resolved (runtime.request), its proposer built (runtime.strategies),
its row run on a batcher (runtime.batcher: a lone call on a one-row batcher in this thread), and its
tokens turned into text and a result (runtime.output)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .auto import ArmHistory
from .backends.base import PREFILL_CHUNK, Backend, BackendLimits
from .batcher import Batcher, run_alone
from .config import DEFAULTS, DecodingConfig
from .errors import InputError
from .grammar import GrammarTokenizer, grammar_tokenizer
from .manifest import Manifest, load_manifest, verify_mode
from .output import Committed, GenerationResult, Stats, StopText, TextStream, drain, pieces, result
from .params import GenerationParams
from .pass_budget import PassBudget
from .prefix_cache import PrefixCache
from .proposers import Proposer
from .request import MAX_WINDOW, ModelFacts, Request, prompt_ids, resolve
from .row import Row
from .slots import DEFAULT_SLOTS, batch_context, default_slots
from .strategies import ProposerInputs, build_proposer
from .tokenizer import Detokenizer, Tokenizer

__all__ = ["Generator", "GenerationResult", "Stats", "TextStream", "MAX_WINDOW", "DEFAULT_SLOTS"]

DEFAULT_JACOBI_TAIL = DEFAULTS.draft.jacobi_tail  # generate()'s default for jacobi_tail


class Generator:
    """A loaded artifact: `generate()` and `stream()` may be called from several threads at once;
    each call opens its own backend context (KV buffers and bindings)."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        prefill_chunk: int | None = None,
        draft: Backend | None = None,
        config: DecodingConfig | Mapping[str, Any] | None = None,
        prefix_cache: bool = True,
    ):
        self.backend = backend
        self.manifest: Manifest = backend.manifest
        self.tokenizer = tokenizer
        overrides = {} if prefill_chunk is None else {"batch.prefill_chunk": prefill_chunk}  # the argument's field
        self.config = DEFAULTS.with_overrides(config).with_overrides(overrides)
        self.prefill_chunk = self.config.batch.prefill_chunk or PREFILL_CHUNK
        self.draft = draft  # a draft model's backend for speculative decoding (same vocabulary)
        self.arm_history = ArmHistory(self.config.auto.max_sit_out)  # `auto` remembers across calls which arms lost
        self.batcher: Batcher | None = None  # start_batching(): every call shares its passes
        # The prefix cache (runtime/prefix_cache.py): a batcher's idle slots keep what finished rows wrote,
        # and lone calls keep their contexts, so the next turn of a conversation prefills only what is new.
        self.prefix_cache = prefix_cache
        self.lone_cache = PrefixCache(prefix_cache and self.config.prefix_cache.contexts > 0, self.config.prefix_cache)
        if not backend.rows.exact_windows:
            logging.getLogger("jacobi_rt").warning(
                "%s (%s)", backend.rows.line(), self.manifest.source.get("name", "artifact")
            )

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
        mapped: bool = False,
    ) -> Generator:
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
        mapped: on the CPU, map the graph optimized and prepacked for this CPU, made at the first such load under
        $JACOBI_RT_CACHE/sessions (runtime/backends/ort_session.py): loads in about half the time, processes
        share the weights' pages, disk about the weights again; decode measured 0.93x at 8B.
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
            return OrtBackend(folder, manifest, backend, threads, graph, mapped)

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

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        *,
        params: GenerationParams | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
        **options,
    ) -> GenerationResult:
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
        return drain(
            self._run(
                self._request(
                    prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options)
                )
            )
        )

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        *,
        params: GenerationParams | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
        **options,
    ) -> Iterator[str]:
        """Like generate(), yielding text pieces as tokens are committed; they join to generate()'s text."""
        request = self._request(
            prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options)
        )
        return (piece for piece in self._run(request) if piece)

    def start(
        self,
        prompt: str | Sequence[int] | None = None,
        max_new_tokens: int | None = None,
        *,
        params: GenerationParams | None = None,
        messages: list[dict] | None = None,
        chat: bool = False,
        **options,
    ) -> TextStream:
        """Like stream(), but the returned TextStream also holds the GenerationResult (`.result`) once
        exhausted, and `close()` ends the generation early, freeing its slot. The request is checked (and
        the prompt tokenized) now; nothing runs until the first piece is asked for."""
        request = self._request(
            prompt, messages, chat, GenerationParams.of(params, max_new_tokens=max_new_tokens, **options)
        )
        committed = Committed()
        return TextStream(self._run(request, committed), len(request.prompt_ids), committed)

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int | None = None,
        *,
        params: GenerationParams | None = None,
        chat: bool = False,
        **options,
    ) -> list[GenerationResult | InputError]:
        """generate() for many prompts at once, sharing every pass (on the batcher of start_batching(), else on
        one opened for this call with a slot per prompt, at most 16; one slot where the backend's contexts
        hold one row). Each prompt is checked alone: one that is invalid (e.g. over the context) gets its
        InputError in its place; the others complete."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InputError(
                "generate_batch() takes a list of prompts (texts or token id lists); use generate() for one"
            )
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
            results = iter([drain(run) for _, run in runs])
        finally:
            if batcher is not self.batcher:
                batcher.close()
        return [next(results) if isinstance(r, Request) else r for r in requests]

    def start_batching(
        self, slots: int | None = None, capacity: int | None = None, batched_draft: bool = True
    ) -> Batcher:
        """From now on, run every generation on one batcher of `slots` rows (continuous batching: a background
        thread runs passes shared by all running generations). slots: default `default_slots()`; more than
        one needs the in-place graph (rows of their own lengths).

        capacity: each row's context (prompt + output); while the batcher runs, `limits.max_context` is
        this capacity. Default: the artifact's, capped where attention reads the whole capacity (runtime.slots).

        batched_draft: the drafting rows share one slotted draft context, one batched draft pass a step
        (runtime.draft_slots; a draft of the in-place graph); False: each row's draft runs its own passes."""
        if self.batcher is not None:
            raise InputError("this Generator already runs a batcher; stop_batching() first")
        if capacity is None:
            capacity = batch_context(self.backend, self.limits.max_context)
        self.batcher = self._batcher(self.default_slots() if slots is None else slots, capacity, batched_draft).start()
        return self.batcher

    def default_slots(self, memory_share: float = 0.25) -> int:
        """The batcher's slots when none are asked for: as many rows as fill `memory_share` of the available
        memory with their KV caches, between 1 and DEFAULT_SLOTS (runtime.slots)."""
        return default_slots(self.backend, self.limits.max_context, memory_share)

    def _batcher(self, slots: int, capacity: int | None = None, batched_draft: bool = True) -> Batcher:
        """A batcher of `slots` rows on this generator's config (prefill chunk, batched prefill budget, cost prior)."""
        chunk = self.limits.prefill_chunk
        cache = PrefixCache(self.prefix_cache, self.config.prefix_cache)
        return Batcher.open(
            self.backend,
            slots,
            capacity,
            prefill_chunk=chunk,
            budget=PassBudget.of(self.config, chunk),
            cache=cache,
            draft=self.draft if batched_draft else None,
        )

    def stop_batching(self) -> None:
        batcher, self.batcher = self.batcher, None
        if batcher is not None:
            batcher.close()

    def close(self) -> None:
        """Stop the batcher and release what the prefix cache keeps (lone calls' contexts, drafts' caches);
        the Generator stays usable."""
        self.stop_batching()
        self.lone_cache.clear()

    # -- request resolution (runtime.request) ----------------------------------------------

    def _request(self, prompt, messages, chat: bool, params: GenerationParams) -> Request:
        """The request resolved against this generator: the prompt's ids, the window, the config."""
        model = self.model_facts()
        return resolve(
            params,
            model,
            lambda: prompt_ids(self.tokenizer, prompt, messages, chat, model),
            lambda constraint: self.grammars().matcher(constraint),
        )

    def model_facts(self) -> ModelFacts:
        """What a request is resolved against now (a running batcher caps the context)."""
        rows = self.backend.rows
        return ModelFacts(
            self.limits,
            self.manifest.architecture.vocab_size,
            self.manifest.max_context,
            self.backend.name,
            self.draft is not None,
            rows.mode,
            rows.exact_windows,
            self.config,
        )

    @property
    def exactness(self) -> str:
        """How this CPU keeps windows exact (runtime/backends/exact_rows.py): native, padded, greedy, ..."""
        return self.backend.rows.mode

    def grammars(self) -> GrammarTokenizer:
        """llguidance's view of this artifact's vocabulary (runtime.constraints), built on first use
        (~0.3 s for 49,152 tokens) and shared by every constrained request."""
        return grammar_tokenizer(self.tokenizer, self.manifest.architecture.vocab_size, self.manifest.tokens.eos_ids)

    # -- the run ----------------------------------------------------------------------------

    def _run(self, request: Request, committed: Committed | None = None) -> Iterator[str]:
        """Yield text pieces; return the GenerationResult (StopIteration.value). A lone call (no batcher
        started) is a one-row batch run in this thread on a context sized to it."""
        if self.batcher is not None:
            _, run = self._on_batcher(self.batcher, request, committed)
            return (yield from run)
        started = time.perf_counter()
        capacity = min(self.limits.max_context, len(request.prompt_ids) + request.max_new_tokens)
        # The target's context first (a kept one when the prompt continues a kept conversation): a
        # proposer's own cache (a draft's) is opened only once it exists.
        ctx, cache = self.lone_cache.context_for(request.prompt_ids, capacity, self.backend.context)
        try:
            row = self._row(request, capacity, self.limits.max_context)
            chunk = self.limits.prefill_chunk
            batches = run_alone(ctx, row, chunk, PassBudget.of(request.config, chunk), cache=cache)
            return (yield from self._pieces(row, request, batches, started, committed))
        finally:
            self.lone_cache.keep_context(ctx, cache)  # kept for the next turn, or closed

    def _on_batcher(
        self, batcher: Batcher, request: Request, committed: Committed | None = None
    ) -> tuple[Row, Iterator[str]]:
        """Queue `request` on the batcher now; the pieces come from the returned generator ("" every 50 ms
        while it waits, so a caller can stop it); closing that generator cancels the row (Batcher.batches)."""
        started = time.perf_counter()
        max_context = min(self.limits.max_context, batcher.capacity)
        capacity = min(max_context, len(request.prompt_ids) + request.max_new_tokens)
        row = batcher.submit(self._row(request, capacity, max_context))
        return row, self._pieces(row, request, batcher.batches(row), started, committed)

    def _row(self, request: Request, capacity: int, max_context: int) -> Row:
        return Row.of(request, self._proposer(request, capacity), set(self.manifest.tokens.eos_ids), max_context)

    def _pieces(
        self,
        row: Row,
        request: Request,
        batches: Iterator[list[int]],
        started: float,
        committed: Committed | None = None,
    ) -> Iterator[str]:
        """The row's text pieces (runtime.output); returns the GenerationResult. `committed` follows the tokens."""
        committed = committed or Committed()
        committed.logprobs = row.sampler.logprobs if request.sampling.logprobs is not None else None
        ids = committed.ids
        text = StopText(request.stop)
        yield from pieces(batches, Detokenizer(self.tokenizer), row.eos_ids, text, ids)
        return result(request, row.outcome(), ids, text, time.perf_counter() - started)

    def _proposer(self, request: Request, capacity: int) -> Proposer:
        """The strategy's proposer (runtime.strategies), tuned by the request's config."""
        inputs = ProposerInputs(
            request.config, capacity, self.limits.branches, self.draft, self.prefill_chunk, self.arm_history
        )
        return build_proposer(request.strategy, inputs)
