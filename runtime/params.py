"""GenerationParams: what one request asks for, in one checked record.

`Generator.generate`/`stream`/`start`/`generate_batch`, the CLI and the server all build one and hand
it down whole: the length, the strategy and its window, stop strings, sampling (runtime.sampling),
what the output must match (runtime.constraints) and the request's decoding tuning (runtime.config
fields). Keywords build it too:

    params = GenerationParams(max_new_tokens=64, strategy="lookahead", sampling=SamplingParams(temperature=0.7, seed=1))
    gen.generate("Hello", params=params)
    gen.generate("Hello", 64, strategy="lookahead", temperature=0.7, seed=1)   # the same request
    gen.generate("Hello", response_format={"type": "json_object"})         # constraint=Constraint.json_object()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from .config import DecodingConfig
from .constraints import Constraint
from .errors import InputError
from .sampling import SamplingParams
from .strategies import STRATEGIES  # the registry's names

Overrides = DecodingConfig | Mapping[str, Any] | None  # a request's decoding config: a whole one, or some fields


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 128
    strategy: str = "auto"  # greedy, jacobi, lookahead, speculative (a draft model) or auto
    window: int | None = None  # the widest pass; None: the strategy's default (plain Jacobi adapts up to it)
    stop: tuple[str, ...] = ()  # the text ends before the first of these
    jacobi_tail: bool | None = None  # speculative: the target's predictions past a rejected guess seed the draft
    sampling: SamplingParams = field(default_factory=SamplingParams)
    config: Overrides = None  # DecodingConfig fields this request changes (runtime.config)
    constraint: Constraint | None = None  # what the output must match (runtime.constraints); None: free text

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        n = self.max_new_tokens
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise InputError(f"max_new_tokens must be a positive integer, not {n!r}")
        w = self.window
        if w is not None and (not isinstance(w, (int, np.integer)) or isinstance(w, bool)):
            raise InputError(f"window must be an integer, not {w!r}")
        if self.jacobi_tail is not None and not isinstance(self.jacobi_tail, (bool, np.bool_)):
            raise InputError(f"jacobi_tail must be true or false, not {self.jacobi_tail!r}")
        if self.config is not None and not isinstance(self.config, (DecodingConfig, Mapping)):
            raise InputError(f"config must be a DecodingConfig or a mapping of its fields, not {self.config!r}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InputError(
                f"constraint must be a runtime.constraints.Constraint (or pass response_format=), "
                f"not {self.constraint!r}"
            )
        if not isinstance(self.sampling, SamplingParams):
            raise InputError(f"sampling must be a SamplingParams, not {self.sampling!r}")
        object.__setattr__(self, "max_new_tokens", int(n))
        object.__setattr__(self, "stop", _stop_strings(self.stop))

    @classmethod
    def of(cls, params: GenerationParams | None = None, **options) -> GenerationParams:
        """`params` (default: all defaults) with `options` changed: this record's fields and SamplingParams'
        (temperature, top_k, top_p, min_p, seed, penalties, logprobs ...); None leaves a field as it is.
        response_format: OpenAI's dict ({"type": "json_object"}, {"type": "json_schema", "json_schema":
        {"schema": {...}}}), made into the constraint."""
        base = params or cls()
        response_format = options.pop("response_format", None)
        if response_format is not None:
            if options.get("constraint") is not None:
                raise InputError("pass either response_format or constraint, not both")
            options["constraint"] = Constraint.from_response_format(response_format)
        if not isinstance(base, GenerationParams):
            raise InputError(f"params must be a GenerationParams, not {base!r}")
        own = [f.name for f in fields(cls) if f.name != "sampling"]
        sampling_fields = [f.name for f in fields(SamplingParams)]
        unknown = sorted(set(options) - set(own) - set(sampling_fields))
        if unknown:
            raise InputError(
                f"unknown argument(s) {', '.join(unknown)}; the sampling arguments are "
                f"{', '.join(sampling_fields)}, the request's {', '.join(own)}"
            )
        sampling = {k: v for k, v in options.items() if k in sampling_fields}
        changed = {k: v for k, v in options.items() if k in own and v is not None}
        if sampling:
            changed["sampling"] = SamplingParams(**{**asdict(base.sampling), **sampling})
        return replace(base, **changed) if changed else base


def _stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else None
    if stops is None or not all(isinstance(s, str) and s for s in stops):
        raise InputError(f"stop must be a non-empty string or a list of non-empty strings, not {stop!r}")
    return stops
