"""Engine records in the manifest: naming, writing, and the refusal of an engine this machine cannot run.

A TensorRT engine runs only on GPUs of the compute capability it was built for, with the
TensorRT version that built it, and only if the file is the one that was built. The runtime
checks all three before deserializing and refuses with the command that rebuilds it. The
checks are pure (the GPU facts are passed in), so they are tested without a GPU.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from jacobi_rt.runtime.backends.cuda import GpuFacts
from jacobi_rt.runtime.errors import ArtifactError, BackendError
from jacobi_rt.runtime.manifest import EngineRecord, Manifest, sha256_file
from jacobi_rt.runtime.spec import MANIFEST_NAME


def rebuild_hint(artifact: str | Path, precision: str) -> str:
    return f"rebuild it on this machine with `jacobi-rt build {artifact} --precision {precision}`"


def engine_file(gpu: GpuFacts, precision: str) -> str:
    """engines/<gpu>-<sm>-<precision>.plan, e.g. engines/nvidia-h200-sm90-fp16.plan."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") or "gpu"
    return f"engines/{slug}-{gpu.sm}-{precision}.plan"


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
                    f"{record.file} was built on a {record.gpu_name} and runs on a {gpu.name} (same compute capability); "
                    f"its kernels were tuned for the other GPU: {rebuild_hint(artifact, record.precision)} for full speed",
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
        raise BackendError(f"the engine {path} recorded in {MANIFEST_NAME} is missing; {rebuild_hint(folder, record.precision)}")
    if sha256_file(path) != record.sha256:
        raise BackendError(
            f"the engine {path} changed after it was built (its sha256 differs from {MANIFEST_NAME}); "
            f"{rebuild_hint(folder, record.precision)}"
        )
    return path


def add_engine(folder: str | Path, manifest: Manifest, record: EngineRecord) -> Manifest:
    """Record `record` (replacing any record of the same file) and write the manifest atomically."""
    manifest.engines = [r for r in manifest.engines if r.file != record.file] + [record]
    save_manifest(folder, manifest)
    return manifest


def save_manifest(folder: str | Path, manifest: Manifest) -> None:
    path = Path(folder) / MANIFEST_NAME
    partial = path.with_name(f".{MANIFEST_NAME}.partial-{os.getpid()}")
    try:
        partial.write_text(manifest.to_json())
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ArtifactError(f"could not write {path} ({exc}); check that the artifact folder is writable") from exc
