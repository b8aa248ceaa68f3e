"""TensorRT engines built from an artifact's ONNX (GPU only): `jacobi-rt build` as a Python API.

    from jacobi_rt.engines import BuildOptions, Limits, build_engine
    record = build_engine("build/smollm2-135m", BuildOptions(precision="fp16", limits=Limits(max_context=4096)))

tensorrt and polygraphy are imported only when an engine is built.
"""

from .build import PRECISIONS, BuildOptions, build_engine, plan_build
from .profiles import Limits, Profile, Range, derive_profiles

__all__ = ["BuildOptions", "Limits", "PRECISIONS", "Profile", "Range", "build_engine", "derive_profiles", "plan_build"]
