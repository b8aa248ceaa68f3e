"""The export's choice of check (budget.check_method) and its layer-by-layer check on a streamed
tiny model: the same files as the full check's export, the figures in the manifest, a wrong layer named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from tiny_models import save_tiny_model, tiny_config

LAYERS = 4


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A 4-layer tiny llama exported twice: with `--check full` (CLI) and with `check` auto on a machine
    of 1000 bytes of memory (library), which checks layer by layer (budget.check_method)."""
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.tools.cli.main import cli

    root = tmp_path_factory.mktemp("layer-check")
    config = tiny_config("llama")
    config.num_hidden_layers = LAYERS
    source = save_tiny_model(config, root / "model")
    result = CliRunner().invoke(cli, ["export", str(source), "--out", str(root / "full"), "--check", "full"])
    assert result.exit_code == 0, (result.output, result.exception)
    export(str(source), root / "layers", ExportOptions(check_memory=1000))
    return source, root / "full", root / "layers", result.stdout


def _manifest(folder: Path):
    from jacobi_rt.runtime.manifest import read_manifest

    return read_manifest(folder)


def test_layers_check_writes_the_full_checks_files(exports):
    source, full, layers, _ = exports
    names = sorted(p.name for p in full.iterdir() if p.name != "jacobi.json")
    assert names == sorted(p.name for p in layers.iterdir() if p.name != "jacobi.json")
    for name in names:
        assert (full / name).read_bytes() == (layers / name).read_bytes(), name
    assert _manifest(full).files == _manifest(layers).files


def test_the_manifest_records_the_check_and_its_figures(exports):
    _, full, layers, stdout = exports
    mine, theirs = _manifest(layers), _manifest(full)
    assert (mine.check_method, theirs.check_method) == ("layer by layer", "full")
    report = mine.check["vs_pytorch"]
    assert [s["stage"] for s in report["stages"]] == ["embedding"] + [f"layer {j}" for j in range(LAYERS)] + ["tail"]
    assert all(
        s["max_hidden_diff"] <= report["hidden_tolerance"] * max(1.0, s["max_abs"]) for s in report["stages"][:-1]
    )
    assert report["positions"] == theirs.check["vs_pytorch"]["positions"] == report["greedy_agree"]
    assert report["max_logit_diff"] == pytest.approx(theirs.check["vs_pytorch"]["max_logit_diff"], abs=1e-5)
    # The in-place graph is checked against the portable ONNX, stage by stage; auto then loads it.
    inplace = mine.check["inplace"]
    assert (inplace["method"], inplace["reference"]) == ("layer by layer", "portable onnx")
    assert inplace["greedy_agree"] == inplace["positions"] == theirs.check["inplace"]["positions"] > 0
    assert inplace["max_logit_diff"] <= 1e-4 and inplace["max_present_diff"] <= 1e-4
    assert mine.inplace_unchecked is None and mine.inplace_attention == theirs.inplace_attention
    assert "export check (full): max |logit diff|" in stdout  # the command passes --check and reports the method


def test_an_inplace_graph_unlike_the_portable_one_is_refused(exports, tmp_path):
    """The staged in-place check can fail: one layer's attention scale changed is named as a disagreement."""
    import onnx

    from jacobi_rt.exporter.checks.inplace_check import check_inplace_against_portable
    from jacobi_rt.exporter.graph.trace import ModelShape
    from jacobi_rt.runtime.errors import ExportCheckError

    _, _, layers, _ = exports
    folder = tmp_path / "art"
    shutil.copytree(layers, folder)
    graph = onnx.load(str(folder / "model-inplace.onnx"), load_external_data=False)
    attention = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == LAYERS
    scale = next(a for a in attention[2].attribute if a.name == "scale")
    scale.f *= 1.5
    onnx.save(graph, str(folder / "model-inplace.onnx"))
    shape = ModelShape(**{k: v for k, v in vars(_manifest(layers).architecture).items() if k != "family"})
    with pytest.raises(ExportCheckError, match="disagrees with portable onnx"):
        check_inplace_against_portable(
            folder / "model.onnx", folder / "model-inplace.onnx", shape, "float32", "model.model.layers."
        )


def test_a_manifest_without_a_method_was_checked_full(exports, tmp_path):
    from jacobi_rt.runtime.errors import ArtifactError

    _, full, _, _ = exports
    folder = tmp_path / "old"
    shutil.copytree(full, folder)
    data = json.loads((folder / "jacobi.json").read_text())
    del data["check"]["vs_pytorch"]["method"]
    (folder / "jacobi.json").write_text(json.dumps(data))
    assert _manifest(folder).check_method == "full"
    data["check"]["vs_pytorch"]["method"] = "sometimes"
    (folder / "jacobi.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"`check.vs_pytorch.method` must be \"full\" or \"layer by layer\""):
        _manifest(folder)


def test_auto_checks_layer_by_layer_when_the_memory_is_small():
    from jacobi_rt.exporter.budget import FULL_CHECK_SHARE, STAGED_ABOVE, STAGED_FULL_CHECK_SHARE, check_method

    weights = STAGED_ABOVE  # the largest run with whole sessions
    assert check_method("auto", weights, available=FULL_CHECK_SHARE * weights) == "full"
    assert check_method("auto", weights, available=FULL_CHECK_SHARE * weights - 1) == "layers"
    big = 4 * STAGED_ABOVE  # staged: the PyTorch model and a margin
    assert check_method("auto", big, available=STAGED_FULL_CHECK_SHARE * big) == "full"
    assert check_method("auto", big, available=STAGED_FULL_CHECK_SHARE * big - 1) == "layers"
    assert check_method("layers", weights, available=10**12) == "layers"
    assert check_method("auto", 1) == "full"  # this machine's MemAvailable holds a byte of weights


def test_big_exports_check_stage_by_stage():
    from jacobi_rt.exporter.budget import STAGED_ABOVE, staged, staged_agreement

    assert staged_agreement("layers", 1) and staged_agreement("full", STAGED_ABOVE + 1) and staged(STAGED_ABOVE + 1)
    assert not staged_agreement("full", STAGED_ABOVE) and not staged(
        STAGED_ABOVE
    )  # SmolLM2-135M's 0.54 GB: whole, as before


def test_full_on_a_model_too_big_is_refused_before_any_work(exports, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime.errors import OptionError

    source = exports[0]
    steps: list[str] = []
    with pytest.raises(OptionError, match=r"use `check` layers \(or auto\)") as caught:
        export(str(source), tmp_path / "a", ExportOptions(check="full", check_memory=1000), step=steps.append)
    assert caught.value.parameters == ("check",)
    assert not any("tracing" in s for s in steps), steps
    assert not (tmp_path / "a").exists() and not list(tmp_path.iterdir())


def test_auto_export_with_little_memory_checks_layer_by_layer(exports):
    """The fixture's `layers` export: `check` auto with 1000 bytes of memory; the same weights as the full check's."""
    _, full, layers, _ = exports
    assert _manifest(layers).check_method == "layer by layer"
    assert (layers / "weights.data").read_bytes() == (full / "weights.data").read_bytes()


def test_a_corrupted_layer_weight_is_named(exports, tmp_path):
    """Layer 2's weight scaled in the artifact's weights file: the export's layer-by-layer check of that
    graph (its streamed skeleton, one layer read in at a time) fails naming layer 2."""
    from jacobi_rt.exporter import sources
    from jacobi_rt.exporter.export import _check_portable
    from jacobi_rt.exporter.graph.layer_graph import LayerGraph
    from jacobi_rt.exporter.graph.trace import probe
    from jacobi_rt.exporter.weights.weight_source import open_model
    from jacobi_rt.runtime.errors import ExportCheckError

    source, _, layers, _ = exports
    folder = tmp_path / "artifact"
    folder.mkdir()
    for name in ("model.onnx", "weights.data"):
        shutil.copyfile(layers / name, folder / name)
    graph = LayerGraph(folder / "model.onnx", LAYERS, "model.model.layers.")
    stages = {s.name: s for s in graph.stages()}
    others = {v for name, s in stages.items() if name != "layer 2" for v in s.initializers}
    weight = next(v for v in stages["layer 2"].initializers if v not in others and len(graph.initializer(v).dims) == 2)
    place = {e.key: e.value for e in graph.initializer(weight).external_data}
    offset, length = int(place["offset"]), int(place["length"])
    with open(folder / "weights.data", "r+b") as f:
        f.seek(offset)
        values = np.frombuffer(f.read(length), dtype=np.float32) * 1.05
        f.seek(offset)
        f.write(values.astype(np.float32).tobytes())

    opened = open_model(sources.resolve(str(source)))
    assert opened.streamed
    with pytest.raises(ExportCheckError, match="in layer 2:"):
        _check_portable(opened, probe(opened.model), folder / "model.onnx", "float32", "layers", None, None)


def test_a_quantized_export_checked_layer_by_layer_records_its_agreement(exports, tmp_path):
    """The float graph checked layer by layer, the int4 graph compared with it stage by stage (both graphs
    a layer at a time, skip norms fused across the layers' boundaries): the same figures as whole (the
    weight pass on the full check's artifact: the same int4 graphs as a fresh export, test_export_reuse.py)."""
    from jacobi_rt.exporter import ExportOptions, export

    steps = []
    manifest = export(
        str(exports[0]), tmp_path / "a", ExportOptions(quantize="int4", check="layers"), step=steps.append
    )
    assert manifest.check_method == "layer by layer"
    assert manifest.check["vs_pytorch"]["greedy_agree"] == manifest.check["vs_pytorch"]["positions"]
    figures = manifest.check["int4_vs_fp"]
    assert figures["reference"] == "unquantized onnx" and figures["method"] == "layer by layer", figures
    assert "comparing the int4 graph with the float one layer by layer" in steps, steps
    source, full, _, _ = exports
    whole = export(str(source), tmp_path / "b", ExportOptions(quantize="int4", graphs_from=str(full)))
    whole = whole.check["int4_vs_fp"]
    assert whole["method"] == "full"
    for key in ("positions", "greedy_agree", "near_ties", "text_agreement"):
        assert figures[key] == whole[key], key
    assert figures["max_logit_diff"] == pytest.approx(whole["max_logit_diff"], rel=1e-4, abs=1e-5)
    assert 0 < whole["agreement"] <= 1 and 0 <= figures["text_agreement"] <= 1
    assert not list((tmp_path / "a").glob(".*.check-*.onnx")), "the stage graphs are deleted after use"
