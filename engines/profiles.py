"""Optimization profiles for a TensorRT engine, derived from the manifest and the user's limits.

TensorRT tunes its kernels at each profile's `opt` shape, so one profile cannot serve both a
256-token prompt chunk and a 1-token decoding pass well. Two profiles:

    decode   window 1..32 (opt 16), past 0..max_context-1 (opt min(1024, half))
    prefill  window 1..256 (opt 256), past 0..max_context-1 (opt one chunk)

The runtime picks, per pass, the first profile (in this order) that covers the pass's batch,
window and past. Every input's range comes from runtime/spec.py's axes, with total = past +
window at the min, opt and max corners, so each corner is a shape the graph can really take.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from jacobi_rt.runtime.backends.base import PREFILL_CHUNK, BackendLimits
from jacobi_rt.runtime.errors import BackendError, InputError
from jacobi_rt.runtime.manifest import Manifest
from jacobi_rt.runtime.spec import BATCH, PAST, TOTAL, WINDOW, graph_inputs

DECODE_WINDOW = 32  # decode kernels are tuned for windows up to this
PREFILL_WINDOW = PREFILL_CHUNK  # the runtime's prefill chunk


@dataclass(frozen=True)
class Range:
    min: int
    opt: int
    max: int

    def __post_init__(self):
        if not 0 <= self.min <= self.opt <= self.max:
            raise InputError(f"a profile range needs 0 <= min <= opt <= max, got {self.min}, {self.opt}, {self.max}")

    def covers(self, value: int) -> bool:
        return self.min <= value <= self.max

    def __add__(self, other: "Range") -> "Range":
        return Range(self.min + other.min, self.opt + other.opt, self.max + other.max)


@dataclass(frozen=True)
class Profile:
    name: str
    batch: Range
    window: Range
    past: Range

    @property
    def total(self) -> Range:
        return self.past + self.window

    def covers(self, batch: int, window: int, past: int) -> bool:
        return self.batch.covers(batch) and self.window.covers(window) and self.past.covers(past)

    def shapes(self, num_layers: int, kv_heads: int, head_dim: int) -> dict[str, tuple[tuple, tuple, tuple]]:
        """input name -> (min shape, opt shape, max shape), from the contract's axes."""
        ranges = {BATCH: self.batch, WINDOW: self.window, PAST: self.past, TOTAL: self.total}
        fixed = {"kv_heads": kv_heads, "head_dim": head_dim}
        out = {}
        for tensor in graph_inputs(num_layers):
            dims = [ranges.get(axis) or Range(fixed[axis], fixed[axis], fixed[axis]) for axis in tensor.axes]
            out[tensor.name] = tuple(tuple(getattr(d, corner) for d in dims) for corner in ("min", "opt", "max"))
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, **{k: [v["min"], v["opt"], v["max"]] for k, v in asdict(self).items() if k != "name"}}

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        return cls(data["name"], *(Range(*data[axis]) for axis in ("batch", "window", "past")))

    def describe(self) -> str:
        return f"{self.name}: batch {_span(self.batch)}, window {_span(self.window)}, past {_span(self.past)}"


def _span(r: Range) -> str:
    return f"{r.min}..{r.max} (opt {r.opt})"


@dataclass(frozen=True)
class Limits:
    """What the engine must serve. max_context None = the manifest's."""

    max_batch: int = 1
    max_context: int | None = None
    decode_window: int = DECODE_WINDOW
    prefill_window: int = PREFILL_WINDOW


def derive_profiles(manifest: Manifest, limits: Limits = Limits()) -> list[Profile]:
    """The decode profile, then the prefill profile (omitted when it would add nothing)."""
    context = _check_limits(manifest, limits)
    past = Range(0, min(1024, context // 2), context - 1)
    batch = Range(1, 1, limits.max_batch)
    decode_max = min(limits.decode_window, context)
    profiles = [Profile("decode", batch, Range(1, min(16, decode_max), decode_max), past)]
    prefill_max = min(limits.prefill_window, context)
    if prefill_max > decode_max:
        prefill_past = Range(0, min(prefill_max, past.max), past.max)
        profiles.append(Profile("prefill", batch, Range(1, prefill_max, prefill_max), prefill_past))
    return profiles


def _check_limits(manifest: Manifest, limits: Limits) -> int:
    context = manifest.max_context if limits.max_context is None else limits.max_context
    if not 2 <= context <= manifest.max_context:
        raise InputError(
            f"--max-context must be between 2 and the artifact's max_context of {manifest.max_context}, not {context}; "
            "re-export with a larger --max-context to go further"
        )
    for name, value in (("--max-batch", limits.max_batch), ("--decode-window", limits.decode_window), ("--prefill-window", limits.prefill_window)):
        if value < 1:
            raise InputError(f"{name} must be at least 1, not {value}")
    return context


def pick_profile(profiles: list[Profile], batch: int, window: int, past: int) -> int | None:
    """Index of the first profile covering this pass, or None."""
    return next((i for i, p in enumerate(profiles) if p.covers(batch, window, past)), None)


def serving_limits(profiles: list[Profile], max_context: int, batch: int = 1) -> BackendLimits:
    """The context, prefill chunk and widest pass an engine with these profiles serves for `batch`.

    Only profiles that start at window 1 and past 0 count: each then covers every window up to its
    max at every past up to its max, so any pass with window <= the largest max and past + window
    below the context is covered by one of them (the runtime keeps past + window <= context - 1).
    """
    usable = [p for p in profiles if p.batch.covers(batch) and p.window.min <= 1 and p.past.min == 0]
    if not usable:
        ranges = "; ".join(p.describe() for p in profiles)
        raise BackendError(f"no optimization profile of the engine serves batch {batch} from an empty cache ({ranges}); "
                           "rebuild it with `jacobi-rt build ARTIFACT`")
    context = min(max_context, min(p.past.max for p in usable) + 1)
    window = min(max(p.window.max for p in usable), context)
    return BackendLimits(max_context=context, prefill_chunk=window, max_window=window)
