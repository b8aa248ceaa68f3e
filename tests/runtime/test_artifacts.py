"""Loading refuses a damaged or foreign artifact with a message that says what to do."""

from __future__ import annotations

import json
import shutil

import pytest

from jacobi_rt.runtime import ArtifactError, Generator


@pytest.fixture
def copy(artifact, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(artifact("llama"), folder)
    return folder


def test_missing_file(copy):
    (copy / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json is missing.*re-export"):
        Generator.load(copy)


def test_altered_file(copy):
    with open(copy / "model.onnx", "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match="model.onnx was changed"):
        Generator.load(copy)


def test_unknown_format_version(copy):
    manifest = json.loads((copy / "jacobi.json").read_text())
    manifest["format_version"] = 99
    (copy / "jacobi.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format_version 99"):
        Generator.load(copy)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        Generator.load(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match="no jacobi.json"):
        Generator.load(tmp_path)


def test_a_good_copy_still_loads_after_failures(copy):
    with pytest.raises(ArtifactError):
        Generator.load(copy / "missing")
    assert len(Generator.load(copy).generate("hi", max_new_tokens=2).ids) == 2


def test_an_unchecked_inplace_graph_is_not_chosen_for_you(copy):
    """Exports checked layer by layer before the in-place graph had a staged check (jacobi-rt of
    2026-12-03) recorded it unchecked (manifest check.inplace.method "none"): "auto" takes the checked
    portable graph; asking for the in-place one warns, and both agree."""
    assert Generator.load(copy).backend.graph == "inplace"
    manifest = json.loads((copy / "jacobi.json").read_text())
    extra_row = manifest["check"]["inplace"]["extra_row"]  # what the graph file has (its cache's spare entry)
    manifest["check"]["inplace"] = {
        "method": "none",
        "unchecked": "checked layer by layer",
        "attention": "gqa",
        "extra_row": extra_row,
    }
    (copy / "jacobi.json").write_text(json.dumps(manifest))
    auto = Generator.load(copy)
    assert auto.backend.graph == "portable"
    with pytest.warns(UserWarning, match=r"not checked against PyTorch \(checked layer by layer\)"):
        inplace = Generator.load(copy, graph="inplace")
    assert inplace.backend.graph == "inplace"
    assert auto.generate("hi", max_new_tokens=6).ids == inplace.generate("hi", max_new_tokens=6).ids
