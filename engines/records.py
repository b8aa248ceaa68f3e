"""Engine records in the manifest: naming and writing (the refusal of an engine this machine cannot run
is the runtime's: runtime/backends/trt_plans.py).

A TensorRT engine runs only on GPUs of the compute capability it was built for, with the
TensorRT version that built it, and only if the file is the one that was built. The runtime
checks all three before deserializing and refuses with the command that rebuilds it. The
checks are pure (the GPU facts are passed in), so they are tested without a GPU.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jacobi_rt.runtime.backends.cuda import GpuFacts
from jacobi_rt.runtime.errors import ArtifactError
from jacobi_rt.runtime.manifest import EngineRecord, Manifest
from jacobi_rt.runtime.spec import MANIFEST_NAME


def engine_file(gpu: GpuFacts, precision: str) -> str:
    """engines/<gpu>-<sm>-<precision>.plan, e.g. engines/nvidia-h200-sm90-fp16.plan."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") or "gpu"
    return f"engines/{slug}-{gpu.sm}-{precision}.plan"


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
