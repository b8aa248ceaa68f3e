"""GPU fixtures: skip with the exact missing piece, and artifact copies with engines for this GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_helpers import ENGINE_DIR, engine_artifact, ort_cuda_missing, tensorrt_missing


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory) -> Path:
    return Path(os.environ.get(ENGINE_DIR) or tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="session")
def trt_artifact(artifact, engine_dir):
    """trt_artifact(name, precision) -> an artifact folder with an engine for this GPU (built once)."""
    reason = tensorrt_missing()
    if reason:
        pytest.skip(reason)
    built = {}

    def get(name: str, precision: str = "fp32") -> Path:
        if (name, precision) not in built:
            tiny = not name.startswith("smollm2")
            built[name, precision] = engine_artifact(
                artifact(name), engine_dir / precision, precision, optimization_level=1 if tiny else None, check=tiny
            )
        return built[name, precision]

    return get


@pytest.fixture(scope="session")
def ort_cuda():
    reason = ort_cuda_missing()
    if reason:
        pytest.skip(reason)
