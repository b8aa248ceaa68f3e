"""The wheel a user installs from the checkout: the SPDX license with its LICENSE file, the prompt set as a
declared data package (no setuptools warning), and the version written once (src/jacobi_rt/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import jacobi_rt

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    setuptools = pytest.importorskip("setuptools", reason="building the wheel needs setuptools>=77")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"building the wheel needs setuptools>=77 (SPDX license strings), found {setuptools.__version__}")
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-v", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (path,) = out.glob("jacobi_rt-*.whl")
    return path, build.stdout + build.stderr


def test_the_wheel_carries_the_license(wheel):
    path, _ = wheel
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        license_text = z.read(next(n for n in names if n.endswith("licenses/LICENSE"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_the_prompt_set_is_a_declared_package_without_warnings(wheel):
    path, log = wheel
    assert "jacobi_rt/tools/data/prompts.jsonl" in zipfile.ZipFile(path).namelist()
    assert "absent from the `packages` configuration" not in log  # setuptools' data-package warning


def test_the_wheel_holds_the_command_line_not_the_measuring_scripts(wheel):
    """tools/ ships what `jacobi-rt` imports (bench, its peers and plots, the random models); benchmarks/ stays in
    the checkout (`python -m benchmarks.NAME`)."""
    path, _ = wheel
    names = zipfile.ZipFile(path).namelist()
    assert not [n for n in names if n.startswith("benchmarks/")]
    tools = sorted(
        n.removeprefix("jacobi_rt/tools/") for n in names if n.startswith("jacobi_rt/tools/") and n.endswith(".py")
    )
    assert [n for n in tools if not n.startswith("cli/")] == [
        "__init__.py",
        "bench.py",
        "bench_plots.py",
        "peers.py",
        "random_gguf.py",
        "random_model.py",
        "random_shapes.py",
        "random_values.py",
        "safetensors_shards.py",
    ]


def test_the_wheel_holds_every_exporter_module(wheel):
    """The exporter's subpackages (graph/, attention/, weights/, checks/) are declared, so each of its modules ships."""
    path, _ = wheel
    names = set(zipfile.ZipFile(path).namelist())
    modules = sorted(p.relative_to(REPO / "exporter").as_posix() for p in (REPO / "exporter").rglob("*.py"))
    assert [m for m in modules if f"jacobi_rt/exporter/{m}" not in names] == []


def test_the_version_is_written_once(wheel):
    path, _ = wheel
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert path.name.startswith(f"jacobi_rt-{jacobi_rt.__version__}-")
