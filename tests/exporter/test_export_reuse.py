"""`graphs_from`: a weight variant made from an exported artifact's checked graphs equals a fresh
export of that variant, and an artifact that does not match is refused before anything is written."""

from __future__ import annotations

import shutil

import onnx
import pytest
from click.testing import CliRunner

from jacobi_rt.runtime.errors import ArtifactError, OptionError


def contents(path) -> tuple[list, dict]:
    """A graph file's nodes (op, inputs, outputs) and its initializers' bytes by name."""
    model = onnx.load(str(path))
    nodes = [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    weights = {i.name: onnx.numpy_helper.to_array(i).tobytes() for i in model.graph.initializer}
    return nodes, weights


def test_a_variant_from_graphs_equals_a_fresh_export(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime.manifest import load_manifest

    base = tiny_artifact("llama")
    fresh = export(str(base.model_dir), tmp_path / "fresh", ExportOptions(quantize="int8"))
    reused = export(
        str(base.model_dir), tmp_path / "reused", ExportOptions(quantize="int8", graphs_from=str(base.artifact))
    )

    assert (
        reused.graphs
        == fresh.graphs
        == base.manifest.graphs
        == {"portable": "model.onnx", "inplace": "model-inplace.onnx"}
    )
    for name in reused.graphs.values():
        assert contents(tmp_path / "reused" / name) == contents(tmp_path / "fresh" / name), name
    assert reused.check["vs_pytorch"] == base.manifest.check["vs_pytorch"]
    assert reused.check["inplace"] == base.manifest.check["inplace"]
    assert reused.check["int8_vs_fp"] == fresh.check["int8_vs_fp"]
    assert reused.created["graphs_from"] == str(base.artifact.resolve()) and "graphs_from" not in fresh.created
    load_manifest(tmp_path / "reused", verify=True)
    assert (
        contents(base.artifact / "model.onnx")[0] != contents(tmp_path / "reused" / "model.onnx")[0]
    )  # the base kept its float graph
    load_manifest(base.artifact, verify=True)


def test_an_artifact_of_another_model_is_refused(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    with pytest.raises(OptionError, match=r"`graphs_from` .* has source weights \(sha256\)") as error:
        export(
            str(tiny_artifact("llama").model_dir),
            tmp_path / "out",
            ExportOptions(quantize="int8", graphs_from=str(tiny_artifact("mistral").artifact)),
        )
    assert error.value.parameters == ("graphs_from",)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_an_artifact_exported_with_other_options_is_refused(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    base = tiny_artifact("llama")
    with pytest.raises(OptionError, match="max_context"):
        export(
            str(base.model_dir),
            tmp_path / "out",
            ExportOptions(quantize="int4", max_context=64, graphs_from=str(base.artifact)),
        )
    with pytest.raises(OptionError, match="kept layers"):
        export(
            str(base.model_dir),
            tmp_path / "out",
            ExportOptions(quantize="int4", keep_layers=1, graphs_from=str(base.artifact)),
        )
    assert list(tmp_path.iterdir()) == []


def test_a_quantized_artifact_is_refused_as_a_base(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    base = tiny_artifact("llama")
    model = str(base.model_dir)
    export(model, tmp_path / "int8", ExportOptions(quantize="int8", graphs_from=str(base.artifact)))
    with pytest.raises(OptionError, match="quantization 'int8'"):
        export(model, tmp_path / "out", ExportOptions(quantize="int4", graphs_from=str(tmp_path / "int8")))


def test_a_changed_graph_file_is_refused(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    base = tiny_artifact("llama")
    changed = tmp_path / "changed"
    shutil.copytree(base.artifact, changed)
    with open(changed / "model-inplace.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="model-inplace.onnx was changed after export"):
        export(str(base.model_dir), tmp_path / "out", ExportOptions(quantize="int8", graphs_from=str(changed)))
    assert not (tmp_path / "out").exists()


def test_a_missing_artifact_is_named(tiny_artifact, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    with pytest.raises(OptionError, match=r"`graphs_from`: artifact folder .*nowhere does not exist"):
        export(
            str(tiny_artifact("llama").model_dir),
            tmp_path / "out",
            ExportOptions(quantize="int8", graphs_from=str(tmp_path / "nowhere")),
        )


def test_graphs_from_needs_a_weight_pass():
    from jacobi_rt.exporter import ExportOptions

    with pytest.raises(OptionError, match="add `quantize` or `weights` gguf"):
        ExportOptions(graphs_from="build/smollm2-135m").validate()


def test_the_command_names_its_flag(tiny_artifact, tmp_path, monkeypatch):
    from jacobi_rt.tools.cli.main import cli

    monkeypatch.delenv("JACOBI_RT_DEBUG", raising=False)
    result = CliRunner().invoke(
        cli,
        [
            "export",
            str(tiny_artifact("llama").model_dir),
            "--out",
            str(tmp_path / "out"),
            "--graphs-from",
            str(tiny_artifact("llama").artifact),
        ],
    )
    assert (
        result.exit_code == 1
        and "--graphs-from reuses an artifact's graphs for a weight pass: add --quantize or --weights gguf"
        in result.output
    ), result.output
