"""DecodingConfig: every tuning constant of decoding in one typed, frozen record, grouped by the method
it tunes (like vLLM's SpeculativeConfig): `jacobi`, `lookahead`, `draft`, `auto`, `costs`, `batch`,
`prefix_cache`, plus the pass width every strategy shares. Each group is handed down whole to the
class it tunes (`AdaptiveWindow(w, config.jacobi)`, `DraftLength(costs, config.draft)`, ...), which
reads its fields from it; the defaults are written once, here.

`Generator(config=...)` / `Generator.load(config=...)` sets a generator's defaults; a call may
override the per-request fields (`generate(..., config={"lookahead": {"branches": 1}})`, or the
dotted `{"lookahead.branches": 1}`), the CLI takes `--decoding lookahead.branches=1`, the server the
same inside a request's "jacobi" object. None of them changes the output (every strategy gives the
tokens of one token a pass, greedy or sampled for a seed): they trade how much is guessed against
what a pass costs. Each field's metadata["why"] says what it is for; `describe()` lists them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from numbers import Integral, Real
from typing import Any

import numpy as np

from .errors import InputError

# Relative cost of one target pass of W tokens vs W=1, SmolLM2-135M fp32 on 2 CPU cores (measured with
# benchmarks/pass_bench.py). Only a prior: PassCosts replaces it with this machine's measured costs.
CPU_PASS_COSTS: dict[int, float] = {1: 1.0, 4: 1.25, 8: 1.6, 16: 1.85, 32: 2.9}
# Relative cost of a batched pass (rows > 1) by its total tokens (rows x width), vs one token: SmolLM2-135M fp32 on
# 2 CPU cores, measured 2026-11-30 with the in-place graph at past 128 (benchmarks/pass_bench.py --batches 1,4,16):
# batch 4 x W 1: 1.27, 1 x 16: 2.16, 16 x 1: 2.77, 16 x 2: 4.31, 16 x 4: 6.81 (noisy: a shared CPU).
BATCH_PASS_COSTS: dict[int, float] = {1: 1.0, 4: 1.27, 16: 2.5, 32: 4.3, 64: 6.8, 256: 25.0}

Costs = tuple[tuple[int, float], ...]


def _field(default: Any, why: str, low: float | None = None, high: float | None = None, load: bool = False):
    """A tuning constant: its reason, its range, and whether only a generator's config sets it (`batcher`)."""
    return field(default=default, metadata={"why": why, "low": low, "high": high, "load": load})


def _group(kind: type, why: str):
    return field(default_factory=kind, metadata={"why": why, "group": True})


class _Checked:
    """Type- and range-checks every field of a frozen config group as it is made."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if not f.metadata.get("group"):
                object.__setattr__(self, f.name, _checked(f, getattr(self, f.name), self._path(f.name)))

    def _path(self, name: str) -> str:
        return f"{GROUP_NAMES[type(self)]}.{name}" if type(self) in GROUP_NAMES else name


@dataclass(frozen=True)
class JacobiConfig(_Checked):
    """Plain Jacobi's window policy (runtime.windows.AdaptiveWindow)."""

    window: int = _field(
        8,
        "plain Jacobi's window when none is given: W=8 passes cost 1.6x W=1 on a CPU, wider ones rarely commit more",
        1,
        64,
    )
    probe_every: int = _field(
        48,
        "adaptive Jacobi tries the slower arm (greedy or W) this often: pass costs and "
        "acceptance drift as the context grows",
        2,
    )
    smoothing: float = _field(0.5, "weight of the newest pass in adaptive Jacobi's per-arm averages", 0.0, 1.0)


@dataclass(frozen=True)
class LookaheadConfig(_Checked):
    """Lookahead's branches, and the acceptance model that cuts its guesses (and Jacobi's chain):
    runtime.acceptance.AcceptanceTracker."""

    branches: int = _field(
        2,
        "lookahead's candidate branches per pass: a second branch catches the runner-up n-gram, "
        "more widen the pass for little",
        1,
        16,
    )
    prior: float = _field(0.5, "chance a lookahead guess is right before any evidence", 0.0, 1.0)
    prior_weight: float = _field(
        2.0, "the prior is worth this many tried tokens: small, so evidence takes over within a few passes", 0.0
    )
    decay: float = _field(
        0.9, "per scoring, old acceptance evidence fades by this: the rate follows the text", 0.0, 1.0
    )
    max_match: int = _field(4, "n-gram match lengths above this share one acceptance statistic", 1)
    margin: float = _field(
        0.03, "guesses are sent only when they beat a greedy pass by this much: the cost table is noisy", 0.0
    )


@dataclass(frozen=True)
class DraftConfig(_Checked):
    """The draft model's length policy (runtime.draft_length.DraftLength) and its chain."""

    max_length: int = _field(8, "most draft tokens per pass: past ~8 a small draft's chain is rarely all right", 1, 64)
    length: int | None = _field(
        None,
        "a fixed number of draft tokens per pass (0..max_length); None: chosen each "
        "pass from measured acceptance and costs",
        0,
        64,
    )
    prior_acceptance: float = _field(
        0.7, "chance a draft token is right before any evidence (drafts of the same family agree often)", 0.0, 1.0
    )
    prior_weight: float = _field(2.0, "the draft prior is worth this many tried tokens", 0.0)
    prior_cost: float = _field(0.5, "a draft pass in target W=1 passes before either is timed", 0.0)
    decay: float = _field(0.9, "per pass, old draft acceptance evidence fades by this", 0.0, 1.0)
    smoothing: float = _field(0.3, "weight of the newest draft pass time in its average", 0.0, 1.0)
    margin: float = _field(0.03, "the draft is run only when it beats a greedy pass by this much", 0.0)
    probe_every: int = _field(
        16, "passes without drafting before the draft is tried again: the text may have become predictable", 1
    )
    jacobi_tail: bool = _field(
        False,
        "speculative: the target's predictions past a rejected guess seed the draft's "
        "next window (measured: saves few draft passes, so off)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.length is not None and self.length > self.max_length:
            raise InputError(
                f"draft.length ({self.length}) must be at most draft.max_length ({self.max_length}); "
                "raise draft.max_length or lower draft.length"
            )


@dataclass(frozen=True)
class AutoConfig(_Checked):
    """`auto`'s choice among its arms (runtime.auto.AutoProposer, ArmHistory)."""

    warmup: int = _field(
        2,
        "passes each of auto's arms gets (measuring it) before each pass goes to the arm whose offer is worth most",
        1,
    )
    probe_every: int = _field(
        16,
        "passes an arm of auto may go without being the best before it is probed (the "
        "wait doubles after each probe that leaves it behind)",
        1,
    )
    decay: float = _field(
        0.95,
        "per pass, auto's measured and predicted arm totals (the check on each arm's offers) "
        "fade by this: slow, so one lucky pass cannot decide",
        0.0,
        1.0,
    )
    probe_budget: int = _field(3, "most guesses an arm on trial sends: probing a slow draft stays cheap", 0)
    max_sit_out: int = _field(
        32, "most calls an arm that lost in earlier calls sits out (its wait doubles per loss)", 0, load=True
    )


@dataclass(frozen=True)
class CostConfig(_Checked):
    """The pass cost curve every allocation prices guesses with (runtime.acceptance.PassCosts)."""

    pass_costs: Costs = _field(
        tuple(CPU_PASS_COSTS.items()),
        "prior cost of a pass of W tokens relative to W=1, as (W, cost) pairs; replaced by measured costs",
    )
    learn: bool = _field(True, "learn the cost curve from measured passes (False: keep the tables; tests)")
    smoothing: float = _field(0.2, "weight of the newest pass time in the measured cost curve", 0.0, 1.0)
    min_samples: int = _field(3, "passes of a width (and of W=1) timed before its measured cost replaces the table", 1)
    batch_pass_costs: Costs = _field(
        tuple(BATCH_PASS_COSTS.items()),
        "prior cost of a batched pass (more than one "
        "row) by its total tokens (rows x width), as "
        "(tokens, cost) pairs; measured costs, keyed by "
        "(rows, width), replace it",
        load=True,
    )


@dataclass(frozen=True)
class BatchConfig(_Checked):
    """Prefill, alone and in the batcher's batch (runtime.pass_budget.PassBudget)."""

    prefill_chunk: int | None = _field(
        None, "prompt tokens per prefill pass; None: the backend's (its profile or graph limit)", 1, load=True
    )
    prefill_tokens: int | None = _field(
        None,
        "tokens of one batched prefill pass, all rows together, so a burst of "
        "long prompts never stalls decoding rows; None: max(prefill_chunk, 16)",
        1,
        load=True,
    )


@dataclass(frozen=True)
class PrefixCacheConfig(_Checked):
    """Which finished rows' caches are kept and reused (runtime.prefix_cache)."""

    min_tokens: int = _field(
        16,
        "a kept prefix is reused when the prompt shares at least this many tokens with it: "
        "below that, moving a slot costs more than it saves",
        1,
        load=True,
    )
    guesses: bool = _field(
        True,
        "a kept prefix keeps its proposer's state too (lookahead's n-gram pool, a draft's "
        "cache), so the next turn's guesses start warm",
        load=True,
    )
    contexts: int = _field(
        4,
        "lone calls (no batcher started) keep this many finished contexts for the next turn of "
        "a conversation (memory: one request's cache each)",
        0,
        load=True,
    )


@dataclass(frozen=True)
class DecodingConfig(_Checked):
    window: int | None = _field(
        None,
        "widest pass (last token + guesses); None: jacobi.window for jacobi (adapting "
        "between 1 and it), guess_window for the others",
        1,
        64,
    )
    guess_window: int = _field(
        16,
        "lookahead/speculative/auto's widest pass when none is given; the proposers send "
        "only what pays, so this only caps them",
        1,
        64,
    )
    jacobi: JacobiConfig = _group(JacobiConfig, "plain Jacobi's window policy")
    lookahead: LookaheadConfig = _group(LookaheadConfig, "lookahead's branches and the acceptance of text guesses")
    draft: DraftConfig = _group(DraftConfig, "the draft model's length policy")
    auto: AutoConfig = _group(AutoConfig, "auto's choice among its arms")
    costs: CostConfig = _group(CostConfig, "the pass cost curve")
    batch: BatchConfig = _group(BatchConfig, "prefill alone and in the batcher's batch")
    prefix_cache: PrefixCacheConfig = _group(PrefixCacheConfig, "the prefix cache across requests")

    def with_overrides(
        self, overrides: Mapping[str, Any] | DecodingConfig | None, per_request: bool = False
    ) -> DecodingConfig:
        """This config with `overrides` applied: a whole config, or a mapping of fields, nested
        ({"draft": {"max_length": 4}}) or dotted ({"draft.max_length": 4}).

        per_request: refuse the fields only a generator's or batcher's config sets (`LOAD_FIELDS`)."""
        if overrides is None:
            return self
        if isinstance(overrides, DecodingConfig):
            overrides = changed_fields(DEFAULTS, overrides)
        if not isinstance(overrides, Mapping):
            raise InputError(
                f"the decoding config must be a DecodingConfig or a mapping of its fields, not {overrides!r}"
            )
        flat = dotted(overrides)
        unknown = sorted(set(flat) - set(FIELDS))
        if unknown:
            raise InputError(
                f"unknown decoding config field(s) {', '.join(map(with_hint, unknown))}; the fields are "
                f"{', '.join(FIELDS)}"
            )
        fixed = sorted(name for name in flat if name in LOAD_FIELDS) if per_request else []
        if fixed:
            raise InputError(
                f"decoding config field(s) {', '.join(fixed)} are set where the generator is loaded "
                "(Generator.load(config=...), `jacobi-rt serve --decoding FIELD=VALUE`), not per request"
            )
        top = {name: value for name, value in flat.items() if "." not in name}
        for group in {name.split(".")[0] for name in flat if "." in name}:
            leaves = {name.split(".", 1)[1]: value for name, value in flat.items() if name.startswith(group + ".")}
            top[group] = replace(getattr(self, group), **leaves)
        return replace(self, **top)


def _checked(f, value: Any, path: str) -> Any:
    """`value` for field `f` (named `path` in messages), type- and range-checked (lists of pairs become
    tuples); InputError otherwise."""
    meta = f.metadata
    kind = type(f.default) if f.default is not None else int
    if value is None:
        if f.default is None:
            return None
        raise InputError(f"decoding config field {path} cannot be null; leave it out for its default ({f.default!r})")
    if kind is tuple:
        return _checked_costs(path, value)
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise InputError(f"decoding config field {path} must be true or false, not {value!r}")
        return bool(value)
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (Integral, Real))
        or (kind is int and not isinstance(value, Integral))
    ):
        raise InputError(
            f"decoding config field {path} must be {'an integer' if kind is int else 'a number'}, not {value!r} "
            f"({meta['why']})"
        )
    value = int(value) if kind is int else float(value)
    low, high = meta["low"], meta["high"]
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise InputError(f"decoding config field {path} must be {bounds}, not {value!r} ({meta['why']})")
    return value


def _checked_costs(path: str, value: Any) -> Costs:
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    try:
        table = tuple(sorted((int(w), float(c)) for w, c in pairs))
    except (TypeError, ValueError):
        raise InputError(
            f"decoding config field {path} must be (width, cost) pairs or a {{width: cost}} mapping, not {value!r}"
        ) from None
    if not table or any(w < 1 or c <= 0 for w, c in table) or len({w for w, _ in table}) != len(table):
        raise InputError(f"decoding config field {path} needs distinct widths >= 1 with positive costs, not {value!r}")
    return table


def dotted(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested overrides as dotted field names: {"draft": {"max_length": 4}} -> {"draft.max_length": 4}."""
    out: dict[str, Any] = {}
    for name, value in overrides.items():
        path = f"{prefix}{name}"
        if path in GROUPS and isinstance(value, Mapping):
            out.update(dotted(value, path + "."))
        elif path in GROUPS and is_dataclass(value) and type(value) is GROUPS[path]:
            out.update({f"{path}.{f.name}": getattr(value, f.name) for f in fields(value)})
        else:
            out[path] = value
    return out


GROUPS: dict[str, type] = {f.name: f.default_factory for f in fields(DecodingConfig) if f.metadata.get("group")}
GROUP_NAMES: dict[type, str] = {kind: name for name, kind in GROUPS.items()}
DEFAULTS = DecodingConfig()
_LEAVES = [(f.name, f) for f in fields(DecodingConfig) if not f.metadata.get("group")] + [
    (f"{group}.{f.name}", f) for group, kind in GROUPS.items() for f in fields(kind)
]
FIELDS: tuple[str, ...] = tuple(path for path, _ in _LEAVES)  # every field's dotted name
# Fields a generator's (or its batcher's) config sets once; a request cannot change them.
LOAD_FIELDS = frozenset(path for path, f in _LEAVES if f.metadata["load"])


def with_hint(name: str) -> str:
    """An unknown field's name, with the field it was probably meant to be (the flat names before the groups:
    draft_max_length -> draft.max_length)."""
    if name in GROUPS:
        return f"{name} (a group: set its fields, {', '.join(path for path in FIELDS if path.startswith(name + '.'))})"
    close = difflib.get_close_matches(name, FIELDS, 1, 0.6)
    return f"{name} (did you mean {close[0]}?)" if close else name


def value_of(config: DecodingConfig, path: str) -> Any:
    """The field `path` ("draft.max_length") of `config`."""
    group, _, name = path.rpartition(".")
    return getattr(getattr(config, group) if group else config, name)


def changed_fields(base: DecodingConfig, config: DecodingConfig) -> dict[str, Any]:
    """The fields of `config` that differ from `base`, by dotted name."""
    return {path: value_of(config, path) for path in FIELDS if value_of(config, path) != value_of(base, path)}


def describe() -> list[tuple[str, Any, str]]:
    """(field, default, why) for every field, by dotted name: the CLI's `--decoding help` and the docs."""
    return [(path, f.default if f.default is not MISSING else None, f.metadata["why"]) for path, f in _LEAVES]
