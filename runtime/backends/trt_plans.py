"""TensorRT plans as the runtime reads them: which engine of an artifact runs here, and what its
optimization profiles serve (`jacobi-rt build` writes both: engines/records.py, engines/profiles.py).

A TensorRT engine runs only on GPUs of the compute capability it was built for, with the TensorRT
version that built it, and only if the file is the one that was built: the runtime checks all three
before deserializing and refuses with the command that rebuilds it (pure checks, the GPU facts
passed in, so tested without a GPU). Per pass it picks the first profile covering the pass's batch,
window and past; every range comes from runtime/spec.py's axes.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import BackendError, InputError
from ..manifest import EngineRecord, Manifest, sha256_file
from ..spec import BATCH, MANIFEST_NAME, PAST, TOTAL, WINDOW, graph_inputs
from .base import BackendLimits
from .cuda import GpuFacts


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

    def __add__(self, other: Range) -> Range:
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
        return {
            "name": self.name,
            **{k: [v["min"], v["opt"], v["max"]] for k, v in asdict(self).items() if k != "name"},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        return cls(data["name"], *(Range(*data[axis]) for axis in ("batch", "window", "past")))

    def describe(self) -> str:
        return f"{self.name}: batch {_span(self.batch)}, window {_span(self.window)}, past {_span(self.past)}"


def _span(r: Range) -> str:
    return f"{r.min}..{r.max} (opt {r.opt})"


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
        raise BackendError(
            f"no optimization profile of the engine serves batch {batch} from an empty cache ({ranges}); "
            "rebuild it with `jacobi-rt build ARTIFACT`"
        )
    context = min(max_context, min(p.past.max for p in usable) + 1)
    window = min(max(p.window.max for p in usable), context)
    return BackendLimits(max_context=context, prefill_chunk=window, max_window=window)


def rebuild_hint(artifact: str | Path, precision: str) -> str:
    return f"rebuild it on this machine with `jacobi-rt build {artifact} --precision {precision}`"


def same_version(a: str, b: str) -> bool:
    """TensorRT engines are tied to major.minor.patch (a build suffix such as .post1 does not matter)."""
    return _release(a) == _release(b)


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:3])


def mismatches(record: EngineRecord, gpu: GpuFacts, tensorrt_version: str) -> list[str]:
    """Why `record` cannot run here (empty when it can)."""
    problems = []
    if record.compute_capability != gpu.compute_capability:
        problems.append(
            f"it was built for compute capability {record.compute_capability} ({record.gpu_name}), "
            f"this GPU is {gpu.compute_capability} ({gpu.name})"
        )
    if not same_version(record.tensorrt_version, tensorrt_version):
        problems.append(f"it was built with TensorRT {record.tensorrt_version}, this is TensorRT {tensorrt_version}")
    return problems


def select_engine(
    manifest: Manifest, gpu: GpuFacts, tensorrt_version: str, artifact: str | Path, precision: str | None = None
) -> EngineRecord:
    """The newest engine of the artifact (of `precision`, if given) that can run here, or a
    BackendError that says why none can and how to rebuild."""
    candidates = [r for r in manifest.engines if r.backend == "tensorrt" and precision in (None, r.precision)]
    wanted = precision or "fp16"
    if not candidates:
        which = f"no {precision} TensorRT engine" if precision else "no TensorRT engine"
        raise BackendError(f"{artifact} has {which}; build one with `jacobi-rt build {artifact} --precision {wanted}`")
    for record in reversed(candidates):
        if not mismatches(record, gpu, tensorrt_version):
            if record.gpu_name != gpu.name:
                warnings.warn(
                    f"{record.file} was built on a {record.gpu_name} and runs on a {gpu.name} "
                    "(same compute capability); its kernels were tuned for the other GPU: "
                    f"{rebuild_hint(artifact, record.precision)} for full speed",
                    stacklevel=2,
                )
            return record
    newest = candidates[-1]
    raise BackendError(
        f"cannot use the engine {newest.file} of {artifact}: {'; '.join(mismatches(newest, gpu, tensorrt_version))}; "
        f"{rebuild_hint(artifact, newest.precision)}"
    )


def verify_engine_file(folder: str | Path, record: EngineRecord) -> Path:
    """The engine's path, after checking it exists and has the sha256 recorded when it was built."""
    path = Path(folder) / record.file
    if not path.is_file():
        raise BackendError(
            f"the engine {path} recorded in {MANIFEST_NAME} is missing; {rebuild_hint(folder, record.precision)}"
        )
    if sha256_file(path) != record.sha256:
        raise BackendError(
            f"the engine {path} changed after it was built (its sha256 differs from {MANIFEST_NAME}); "
            f"{rebuild_hint(folder, record.precision)}"
        )
    return path
