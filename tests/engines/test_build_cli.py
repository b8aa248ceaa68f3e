"""`jacobi-rt build` and the TensorRT backend on a machine without TensorRT or a GPU: argument
errors and clear, one-line messages (the build itself is in test_trt_gpu.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from click.testing import CliRunner
from manifests import H200, L4

from jacobi_rt.engines import BuildOptions, plan_build
from jacobi_rt.engines.build import check_gpu_precision, default_timing_cache
from jacobi_rt.runtime.backends.cuda import GpuFacts
from jacobi_rt.runtime.errors import InputError, MissingDependencyError
from jacobi_rt.tools.cli.main import cli

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
needs_no_tensorrt = pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed here")


def run(*args):
    return CliRunner().invoke(cli, ["build", *map(str, args)])


def one_line_error(result, match: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1 and "Traceback" not in result.output
    assert match in result.output, result.output


def test_help_lists_the_options():
    result = run("--help")
    assert result.exit_code == 0
    for option in (
        "--precision",
        "--max-batch",
        "--max-context",
        "--decode-window",
        "--prefill-window",
        "--timing-cache",
        "--check",
    ):
        assert option in result.output


@needs_no_tensorrt
def test_missing_tensorrt_is_one_line_with_the_install_command(artifact):
    one_line_error(
        run(artifact("llama")),
        (
            "tensorrt is not installed (No module named 'tensorrt'); install it with: "
            'pip install "tensorrt>=10" polygraphy (from the jacobi-rt checkout: pip install ".[tensorrt]")'
        ),
    )


@pytest.fixture
def quantized(artifact, tmp_path):
    folder = shutil.copytree(artifact("llama"), tmp_path / "llama-int8")
    data = json.loads((folder / "jacobi.json").read_text())
    (folder / "jacobi.json").write_text(json.dumps({**data, "quantization": "int8"}))
    return folder


def test_argument_errors_come_before_tensorrt(artifact, quantized, tmp_path):
    folder = artifact("llama")
    one_line_error(
        run(folder, "--max-context", 100000), "--max-context must be between 2 and the artifact's max_context of 256"
    )
    one_line_error(run(folder, "--timing-cache", tmp_path / "t.cache", "--no-timing-cache"), "do not mix")
    one_line_error(run(quantized), "TensorRT cannot read; export the model without --quantize")
    one_line_error(run(tmp_path), "has no jacobi.json")
    assert run(folder, "--precision", "fp9").exit_code == 2
    assert run(folder, "--max-batch", 0).exit_code == 2
    assert run(tmp_path / "missing").exit_code == 2


def test_plan_derives_profiles_without_a_gpu(artifact):
    plan = plan_build(artifact("llama"), BuildOptions(precision="bf16"))
    assert [p.name for p in plan.profiles] == ["decode", "prefill"] and plan.onnx.name == "model.onnx"
    with pytest.raises(InputError, match="--opt-level must be between 0 and 5"):
        plan_build(artifact("llama"), BuildOptions(optimization_level=7))
    with pytest.raises(InputError, match="--precision must be one of"):
        plan_build(artifact("llama"), BuildOptions(precision="fp4"))


def test_precisions_the_gpu_cannot_run_are_refused():
    check_gpu_precision("fp16", GpuFacts("Tesla T4", "7.5"))
    check_gpu_precision("fp8", H200)
    with pytest.raises(
        InputError, match="bf16 needs compute capability 8.0 or newer; this Tesla T4 has 7.5: use --precision fp16"
    ):
        check_gpu_precision("bf16", GpuFacts("Tesla T4", "7.5"))
    with pytest.raises(InputError, match="fp8 needs compute capability 8.9"):
        check_gpu_precision("fp8", GpuFacts("NVIDIA A100", "8.0"))
    check_gpu_precision("fp8", L4)


def test_timing_cache_lives_in_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_timing_cache("10.8.0", H200) == tmp_path / "jacobi-rt/tensorrt/timing-10.8.0-sm90.cache"


@needs_no_tensorrt
def test_tensorrt_backend_without_tensorrt_says_what_to_install(artifact):
    from jacobi_rt.runtime import Generator

    with pytest.raises(MissingDependencyError, match="tensorrt is not installed"):
        Generator.load(artifact("llama"), backend="tensorrt")


def test_unknown_backend_is_refused(artifact):
    from jacobi_rt.runtime import Generator

    with pytest.raises(InputError, match="backend must be auto, cpu, cuda or tensorrt, not 'gpu'"):
        Generator.load(artifact("llama"), backend="gpu")


@pytest.mark.parametrize(
    "module",
    [
        "jacobi_rt.runtime.backends.tensorrt",
        "jacobi_rt.engines",
        "jacobi_rt.engines.check",
        "jacobi_rt.tools.cli.build",
    ],
)
def test_modules_import_first_in_a_fresh_process_without_tensorrt(module):
    import subprocess
    import sys

    code = f"import sys, {module}; print(','.join(m for m in ('tensorrt', 'polygraphy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
