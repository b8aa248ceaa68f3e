"""What the GPU tests and the GPU benchmark share: why they cannot run here, and artifact copies
with an engine for this GPU (built once, reused while it still matches)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from jacobi_rt.engines import BuildOptions, Limits, build_engine
from jacobi_rt.runtime.backends.cuda import gpu_facts
from jacobi_rt.runtime.backends.tensorrt import load_tensorrt
from jacobi_rt.runtime.backends.trt_plans import select_engine, verify_engine_file
from jacobi_rt.runtime.errors import BackendError, MissingDependencyError
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.spec import MANIFEST_NAME

ENGINE_DIR = "JACOBI_RT_ENGINE_DIR"  # where artifact copies with engines live (scripts/gpu_check.sh sets it)


def gpu_missing() -> str | None:
    try:
        gpu_facts()
    except BackendError as exc:
        return "no NVIDIA GPU visible" if "no NVIDIA GPU visible" in str(exc) else f"no usable GPU ({exc})"
    return None


def tensorrt_missing() -> str | None:
    """Why the TensorRT tests cannot run here, or None."""
    try:
        load_tensorrt()
    except MissingDependencyError:
        return "tensorrt is not installed"
    if importlib.util.find_spec("polygraphy") is None:
        return "polygraphy is not installed"
    return gpu_missing()


def ort_cuda_missing() -> str | None:
    """Why the onnxruntime CUDA tests cannot run here, or None."""
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime-gpu is not installed (onnxruntime lists no CUDAExecutionProvider)"
    return gpu_missing()


def engine_artifact(
    source: Path,
    workdir: Path,
    precision: str,
    optimization_level: int | None = None,
    limits: Limits = Limits(),
    check: bool = False,
    log=print,
) -> Path:
    """workdir/<name>: `source` linked file by file (its own jacobi.json), with a `precision` engine
    for this GPU; built only when no valid one is there yet."""
    folder = Path(workdir) / Path(source).name
    if not (folder / MANIFEST_NAME).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for path in Path(source).iterdir():
            if path.is_file() and path.name != MANIFEST_NAME:
                os.symlink(path.resolve(), folder / path.name)
        shutil.copy(Path(source) / MANIFEST_NAME, folder / MANIFEST_NAME)
    manifest = load_manifest(folder)
    try:
        record = select_engine(manifest, gpu_facts(), load_tensorrt().__version__, folder, precision)
        verify_engine_file(folder, record)
        return folder
    except BackendError:
        pass
    options = BuildOptions(
        precision=precision, limits=limits, optimization_level=optimization_level, check=check, progress=False
    )
    build_engine(folder, options, log=log)
    return folder
