"""Small in-memory manifests and engine records for the GPU-free engine tests."""

from __future__ import annotations

from jacobi_rt.runtime.backends.cuda import GpuFacts
from jacobi_rt.runtime.manifest import Architecture, EngineRecord, Manifest, Tokens

H200 = GpuFacts("NVIDIA H200", "9.0")
H100 = GpuFacts("NVIDIA H100 80GB HBM3", "9.0")
L4 = GpuFacts("NVIDIA L4", "8.9")


def manifest(max_context: int = 8192, layers: int = 30, engines: list | None = None) -> Manifest:
    return Manifest(
        format_version=1,
        role="target",
        source={"kind": "builtin", "name": "test"},
        architecture=Architecture("llama", layers, 9, 3, 64, 576, 49152, 8192),
        tokens=Tokens(1, [2], 2),
        dtype="float16",
        opset=18,
        max_context=max_context,
        quantization=None,
        graphs={"portable": "model.onnx"},
        tokenizer={},
        files={},
        engines=engines or [],
    )


def record(
    gpu: GpuFacts = H200,
    tensorrt: str = "10.8.0",
    precision: str = "fp16",
    file: str | None = None,
    sha256: str = "0" * 64,
) -> EngineRecord:
    return EngineRecord(
        file=file or f"engines/{gpu.name.lower().replace(' ', '-')}-{gpu.sm}-{precision}.plan",
        sha256=sha256,
        precision=precision,
        tensorrt_version=tensorrt,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        profiles=[{"name": "decode", "batch": [1, 1, 1], "window": [1, 16, 32], "past": [0, 1024, 8191]}],
        build_seconds=42.0,
    )
