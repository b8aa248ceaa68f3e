"""The runtime never imports torch, transformers or the exporter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_runtime_import_loads_no_torch():
    code = (
        "import sys, jacobi_rt.runtime, jacobi_rt.runtime.backends.onnxrt, jacobi_rt.tools.cli.generate\n"
        "import importlib.util, jacobi_rt.runtime.constraints as c\n"
        "if importlib.util.find_spec('llguidance'): c.Constraint.regex('[a-z]+')  # llguidance loaded too\n"
        "bad = [m for m in ('torch', 'transformers', 'jacobi_rt.exporter') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == ""


@pytest.mark.skipif(
    os.environ.get("JACOBI_RT_TORCH_FREE") != "1",
    reason="only in the torch-free venv: set JACOBI_RT_TORCH_FREE=1 there",
)
def test_torch_is_not_installed():
    with pytest.raises(ImportError):
        import torch  # noqa: F401
