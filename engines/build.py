"""Build a TensorRT engine from an artifact's ONNX and record it in the manifest (`jacobi-rt build`).

Polygraphy's loaders do the TensorRT work:

    EngineBytesFromNetwork(NetworkFromOnnxPath(model.onnx),
                           CreateConfig(fp16=..., profiles=[decode, prefill], load_timing_cache=...,
                                        progress_monitor=...), save_timing_cache=...)

Everything that can be refused without a GPU (the artifact, the precision against its
quantization, the profile limits) is checked before tensorrt is imported, so argument errors
are reported the same on every machine.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from jacobi_rt.runtime.backends.cuda import GpuFacts, gpu_facts
from jacobi_rt.runtime.errors import BackendError, InputError, require
from jacobi_rt.runtime.manifest import EngineRecord, Manifest, load_manifest, sha256_file

from .profiles import Limits, Profile, derive_profiles
from .records import add_engine, engine_file

PRECISIONS = ("fp16", "bf16", "fp32", "fp8", "int8")
QUANTIZED = ("fp8", "int8")  # need QuantizeLinear/DequantizeLinear nodes in the ONNX
MIN_CAPABILITY = {"bf16": (8, 0), "fp8": (8, 9)}
POLYGRAPHY_HINT = (
    'pip install polygraphy (from the jacobi-rt checkout: pip install ".[tensorrt]"); it drives the TensorRT build'
)


@dataclass(frozen=True)
class BuildOptions:
    precision: str = "fp16"
    limits: Limits = field(default_factory=Limits)
    timing_cache: Path | None = None  # None: default_timing_cache(); reused and extended by every build
    use_timing_cache: bool = True
    optimization_level: int | None = None  # TensorRT's builder optimization level, 0-5 (TensorRT's default: 3)
    workspace_gib: float | None = None  # cap on the builder's scratch memory
    check: bool = False  # compare with onnxruntime afterwards and record the figures
    progress: bool = True


@dataclass
class BuildPlan:
    folder: Path
    manifest: Manifest
    onnx: Path
    profiles: list[Profile]
    precision: str


def plan_build(folder: str | Path, options: BuildOptions) -> BuildPlan:
    """Read and verify the artifact, refuse what cannot be built, derive the profiles. No GPU needed."""
    folder = Path(folder)
    if options.precision not in PRECISIONS:
        raise InputError(f"--precision must be one of {', '.join(PRECISIONS)}, not {options.precision!r}")
    if options.optimization_level is not None and not 0 <= options.optimization_level <= 5:
        raise InputError(f"--opt-level must be between 0 and 5, not {options.optimization_level}")
    manifest = load_manifest(folder)
    if manifest.quantization:
        raise InputError(
            f"{folder} holds {manifest.quantization} weights (onnxruntime's MatMulNBits), which TensorRT "
            "cannot read; export the model without --quantize or --weights gguf and build with "
            "--precision fp16 (or bf16)"
        )
    onnx = folder / manifest.graphs["portable"]
    return BuildPlan(folder, manifest, onnx, derive_profiles(manifest, options.limits), options.precision)


def check_gpu_precision(precision: str, gpu: GpuFacts) -> None:
    need = MIN_CAPABILITY.get(precision)
    have = tuple(int(x) for x in gpu.compute_capability.split("."))
    if need and have < need:
        raise InputError(
            f"--precision {precision} needs compute capability {need[0]}.{need[1]} or newer; this {gpu.name} has "
            f"{gpu.compute_capability}: use --precision fp16"
        )


def default_timing_cache(tensorrt_version: str, gpu: GpuFacts) -> Path:
    """One timing cache per TensorRT version and GPU architecture, in the user's cache folder."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "jacobi-rt" / "tensorrt" / f"timing-{tensorrt_version}-{gpu.sm}.cache"


def build_engine(
    folder: str | Path, options: BuildOptions = BuildOptions(), log: Callable[[str], None] = print
) -> EngineRecord:
    """Build, write `engines/<gpu>-<sm>-<precision>.plan` into the artifact, record it; returns the record."""
    from jacobi_rt.runtime.backends.tensorrt import load_tensorrt  # it imports this package's profiles

    plan = plan_build(folder, options)
    trt = load_tensorrt()
    require("polygraphy", POLYGRAPHY_HINT)
    gpu = gpu_facts()
    check_gpu_precision(options.precision, gpu)
    cache = None
    if options.use_timing_cache:
        cache = Path(options.timing_cache or default_timing_cache(trt.__version__, gpu))
        cache.parent.mkdir(parents=True, exist_ok=True)
    log(
        f"building a {options.precision} TensorRT {trt.__version__} engine for {gpu.name} "
        f"(compute {gpu.compute_capability}) from {plan.onnx}"
    )
    for profile in plan.profiles:
        log(f"  profile {profile.describe()}")
    if plan.manifest.dtype == "float32" and options.precision != "fp32":
        log("  note: the artifact's inputs and KV cache stay float32; `jacobi-rt export --dtype fp16` halves the cache")
    started = time.perf_counter()
    engine_bytes = _build_bytes(trt, plan, options, cache)
    seconds = time.perf_counter() - started
    record = EngineRecord(
        file=engine_file(gpu, options.precision),
        sha256="",
        precision=options.precision,
        tensorrt_version=trt.__version__,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        profiles=[p.to_dict() for p in plan.profiles],
        build_seconds=round(seconds, 1),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path = _write(plan.folder / record.file, engine_bytes)
    record.sha256 = sha256_file(path)
    log(
        f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {seconds:.0f} s"
        + (f"; timing cache {cache}" if cache else "")
    )
    if options.check:
        from .check import check_engine

        record.check = check_engine(plan.folder, plan.manifest, record)
        log(
            f"check vs onnxruntime: max |logit diff| {record.check['max_logit_diff']:.3g}, "
            f"greedy ids agree at {record.check['greedy_agreement']:.2%} of {record.check['positions']} positions"
        )
    add_engine(plan.folder, plan.manifest, record)
    return record


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise BackendError(
            f"could not write the engine to {path} ({exc}); check the space and permissions there"
        ) from exc
    return path


def _build_bytes(trt, plan: BuildPlan, options: BuildOptions, cache: Path | None):
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath
    from polygraphy.backend.trt import Profile as ShapeProfile
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    arch = plan.manifest.architecture
    profiles = []
    for profile in plan.profiles:
        shapes = ShapeProfile()
        for name, (low, opt, high) in profile.shapes(arch.num_layers, arch.kv_heads, arch.head_dim).items():
            shapes.add(name, low, opt, high)
        profiles.append(shapes)
    precision = options.precision
    limits = {trt.MemoryPoolType.WORKSPACE: int(options.workspace_gib * 2**30)} if options.workspace_gib else None
    try:
        with G_LOGGER.verbosity(G_LOGGER.WARNING):
            network = NetworkFromOnnxPath(str(plan.onnx))()
            if precision in QUANTIZED:
                _require_qdq(trt, network[1], plan)
            config = CreateConfig(
                fp16=precision in ("fp16", *QUANTIZED),
                bf16=precision == "bf16",
                int8=precision == "int8",
                fp8=precision == "fp8",
                profiles=profiles,
                load_timing_cache=str(cache) if cache else None,
                builder_optimization_level=options.optimization_level,
                memory_pool_limits=limits,
                progress_monitor=_progress_monitor(trt) if options.progress else None,
            )
            return EngineBytesFromNetwork(network, config=config, save_timing_cache=str(cache) if cache else None)()
    except PolygraphyException as exc:
        raise BackendError(f"TensorRT could not build {plan.onnx}: {exc}") from exc


def _require_qdq(trt, network, plan: BuildPlan) -> None:
    kinds = {trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE}
    if not any(network.get_layer(i).type in kinds for i in range(network.num_layers)):
        raise InputError(
            f"--precision {plan.precision} needs an ONNX with QuantizeLinear/DequantizeLinear nodes (e.g. from NVIDIA "
            f"ModelOpt), and {plan.onnx} has none; build with --precision fp16 or bf16"
        )


def _progress_monitor(trt):
    """A tqdm bar per TensorRT build phase (TensorRT 10's IProgressMonitor), or None."""
    if not hasattr(trt, "IProgressMonitor"):
        return None
    from tqdm import tqdm

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self._bars, self._lock = {}, threading.Lock()  # TensorRT calls from several threads

        def phase_start(self, phase_name, parent_phase, num_steps):
            with self._lock:
                depth = len(self._bars)
                self._bars[phase_name] = tqdm(
                    total=num_steps, desc=phase_name, position=depth, leave=False, file=sys.stderr
                )

        def step_complete(self, phase_name, step):
            with self._lock:
                bar = self._bars.get(phase_name)
                if bar is not None:
                    bar.update(step + 1 - bar.n)
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            with self._lock:
                bar = self._bars.pop(phase_name, None)
                if bar is not None:
                    bar.close()

    return BuildProgress()
