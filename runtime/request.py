"""Request resolution: a request's parameters resolved against the loaded model into one Request.

`resolve` reads only two records: the request's `GenerationParams` and the model's `ModelFacts`
(its limits, vocabulary, draft and exactness, and the generator's decoding config). Every check a
request can fail happens here, before anything runs, in this order: the config's fields, the
window, jacobi_tail, the prompt, the constraint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .backends.base import BackendLimits
from .config import DEFAULTS, DecodingConfig, changed_fields, dotted
from .constraints import Constraint
from .errors import ContextLimitError, InputError
from .grammar import Matcher
from .params import GenerationParams, Overrides
from .sampling import SamplingParams, draw_seed

MAX_WINDOW = 64


@dataclass(frozen=True)
class ModelFacts:
    """What a request is resolved against: the loaded model as one explicit record."""

    limits: BackendLimits  # the context (a running batcher's capacity), prefill chunk, widest pass, branches
    vocab_size: int
    artifact_context: int  # the manifest's max_context (to say which limit a prompt exceeds)
    backend_name: str
    has_draft: bool
    exactness: str  # the backend's exact_rows mode (runtime/backends/exact_rows.py)
    exact_windows: bool  # False: no window is exact on this CPU, every strategy decodes greedily
    config: DecodingConfig  # the generator's decoding config


@dataclass
class Request:
    """A resolved request. Its window and jacobi_tail live in `config` only (`window` reads it)."""

    prompt_ids: list[int]
    max_new_tokens: int
    strategy: str
    adaptive: bool
    stop: list[str]
    sampling: SamplingParams = SamplingParams()
    config: DecodingConfig = DEFAULTS  # the generator's, with the request's overrides; window and jacobi_tail resolved
    exactness: str = ""  # the backend's exact_rows mode when the request was made
    matcher: Matcher | None = None  # the grammar's state for this request's output (params.constraint)

    @property
    def window(self) -> int:
        return self.config.window


def resolve(
    params: GenerationParams,
    model: ModelFacts,
    prompt_ids: Callable[[], list[int]],
    matcher: Callable[[Constraint], Matcher],
) -> Request:
    """The request `params` asks of `model`; `prompt_ids` tokenizes the prompt, `matcher` compiles a
    constraint (each called once the checks before it passed)."""
    overrides = _overrides(params.config, model.config)
    decoding = model.config.with_overrides(overrides, per_request=True)  # checked, window and jacobi_tail too
    window, jacobi_tail = requested_window(params, overrides, decoding)
    strategy = params.strategy
    if not model.exact_windows:  # no window is exact on this CPU (exact_rows.py): decode greedily
        strategy, window, jacobi_tail = "greedy", None, None
    adaptive = strategy == "jacobi" and window is None and decoding.window is None
    window = _window(strategy, window, decoding, model)
    tail = _jacobi_tail(strategy, jacobi_tail, decoding, model)
    sampling = params.sampling
    if sampling.sampled and sampling.seed is None:
        sampling = sampling.with_seed(draw_seed())
    return Request(
        prompt_ids=prompt_ids(),
        max_new_tokens=params.max_new_tokens,
        strategy=strategy,
        adaptive=adaptive,
        stop=list(params.stop),
        sampling=sampling,
        config=replace(decoding, window=window, draft=replace(decoding.draft, jacobi_tail=tail)),
        exactness=model.exactness,
        matcher=None if params.constraint is None else matcher(params.constraint),
    )


def requested_window(
    params: GenerationParams, overrides: dict[str, Any], decoding: DecodingConfig
) -> tuple[int | None, bool | None]:
    """The window and jacobi_tail the request chose itself (None: it left them to the config and the
    strategy): the argument, else the request's own config field. The one place the two are reconciled."""
    window, jacobi_tail = params.window, params.jacobi_tail
    if window is None and "window" in overrides:
        window = decoding.window
    if jacobi_tail is None and "draft.jacobi_tail" in overrides:
        jacobi_tail = decoding.draft.jacobi_tail
    return window, jacobi_tail


def _overrides(config: Overrides, base: DecodingConfig) -> dict[str, Any]:
    """A request's config as the fields it changes from the generator's."""
    if config is None:
        return {}
    if isinstance(config, DecodingConfig):
        return changed_fields(base, config)
    return dotted(config)


def _window(strategy: str, window, decoding: DecodingConfig, model: ModelFacts) -> int:
    """The request's window (checked), else the config's, else the strategy's default from the config."""
    if strategy == "greedy":
        if window not in (None, 1):
            raise InputError(
                f"greedy decoding uses a window of 1, not {window}; use strategy='jacobi' for a larger window"
            )
        return 1
    if strategy == "speculative" and not model.has_draft:
        raise InputError(
            "strategy 'speculative' needs a draft model: Generator.load(target, draft=DRAFT_DIR) "
            "(export one with `jacobi-rt export MODEL --role draft`)"
        )
    widest = min(MAX_WINDOW, model.limits.max_window)
    default = decoding.window or (decoding.jacobi.window if strategy == "jacobi" else decoding.guess_window)
    window = min(default, widest) if window is None else int(window)
    if not 1 <= window <= widest:
        raise InputError(
            f"window must be between 1 and {widest} tokens on this backend ({model.backend_name}), not {window}"
        )
    return window


def _jacobi_tail(strategy: str, jacobi_tail, decoding: DecodingConfig, model: ModelFacts) -> bool:
    """The request's jacobi_tail (checked: it belongs to the draft's chain), else the config's."""
    if jacobi_tail is None:
        return decoding.draft.jacobi_tail
    if strategy not in ("speculative", "auto") or not model.has_draft:
        raise InputError(
            "jacobi_tail is an option of the draft model's chain: use strategy 'speculative' "
            "(or 'auto') with a draft model, or leave jacobi_tail out"
        )
    return bool(jacobi_tail)


def prompt_ids(
    tokenizer, prompt: str | Sequence[int] | None, messages: list[dict] | None, chat: bool, model: ModelFacts
) -> list[int]:
    """The prompt's token ids (text, ids, or chat messages rendered by the chat template), checked
    against the vocabulary and the context."""
    if messages is not None:
        if prompt is not None:
            raise InputError("pass either a prompt or chat messages, not both")
        ids = tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True), add_special_tokens=False)
    elif isinstance(prompt, str):
        if not prompt:
            raise InputError("the prompt is empty; pass some text or token ids")
        if chat:
            chat_text = tokenizer.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = tokenizer.encode(chat_text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(prompt)
    elif prompt is None:
        raise InputError("nothing to generate from: pass a prompt (text or token ids) or chat messages")
    else:
        ids = _check_ids(prompt, model.vocab_size)
    if not ids:
        raise InputError("the prompt encodes to no tokens; pass some text or token ids")
    limit = model.limits.max_context
    if len(ids) >= limit:
        where = (
            "this artifact's context"
            if limit == model.artifact_context
            else f"the {model.backend_name} engine's context"
        )
        raise ContextLimitError(
            f"the prompt has {len(ids)} tokens, but {where} holds {limit} (prompt + output); shorten the prompt, "
            "or re-export (or rebuild the engine) with a larger max_context if the model allows it"
        )
    return ids


def _check_ids(prompt, vocab: int) -> list[int]:
    try:
        array = np.asarray(prompt)
    except (TypeError, ValueError) as exc:
        raise InputError(f"the prompt must be text or a flat list of token ids ({exc})") from exc
    if array.size == 0:
        raise InputError("the prompt is empty; pass some text or token ids")
    ints = array.ndim == 1 and all(type(t) is int for t in array.tolist())  # tolist: numpy ints become int, bools bool
    if not ints:
        raise InputError(
            f"token ids must be a flat list of integers, got an array of {array.dtype} with shape {list(array.shape)}"
        )
    bad = [t for t in array.tolist() if not 0 <= t < vocab]  # Python ints: 2**70 too (numpy holds it as an object)
    if bad:
        raise InputError(
            f"token id {bad[0]} is outside this model's vocabulary (0..{vocab - 1}); "
            "encode the text with this artifact's tokenizer"
        )
    return array.tolist()
