"""Weight-only int8 / int4 quantization of one tiny model: MatMulNBits in the graph, figures in the manifest."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_helpers import assert_graph_contract, hf_case, run, sha256

BITS = {"int8": 8, "int4": 4}


@dataclass
class Quantized:
    family: str
    kind: str
    folder: Path
    manifest: object


# llama: untied LM head; llama-mha-tied: the LM head reads the embedding table through a Transpose
CASES = [("llama", "int8"), ("llama", "int4"), ("llama-mha-tied", "int4")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{k}" for f, k in CASES])
def quantized(request, tiny_artifact, tmp_path_factory):
    """The weight pass on the session's float artifact of the family (`graphs_from`: no second trace and
    check). A fresh quantized export makes the same graphs and figures (test_export_reuse.py,
    tests/exporter/data/weight_pass/); the fresh path itself runs in test_quantize_with_external_data,
    test_export_cli.py's progress bars and test_export_layer_check.py."""
    from jacobi_rt.exporter import ExportOptions, export

    family, kind = request.param
    base = tiny_artifact(family)
    out = tmp_path_factory.mktemp("quantized") / f"{family}-{kind}"
    options = ExportOptions(quantize=kind, graphs_from=str(base.artifact))
    return Quantized(family, kind, out, export(str(base.model_dir), out, options))


def weight_matmuls(graph) -> list[str]:
    """MatMul nodes whose second input is a stored weight, directly or through a Transpose
    (what weight-only quantization should have replaced)."""
    weights = {init.name for init in graph.initializer}
    transposed = {n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] in weights}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights | transposed]


def test_graph_uses_matmulnbits(quantized):
    kind, folder = quantized.kind, quantized.folder
    graph = onnx.load(str(folder / "model.onnx")).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert nbits, "no MatMulNBits node in the quantized graph"
    assert {onnx.helper.get_attribute_value(a) for n in nbits for a in n.attribute if a.name == "bits"} == {BITS[kind]}
    assert weight_matmuls(graph) == [], "float MatMul weights left unquantized"
    # the fast kernel path: no zero-point input (8 / 128 implied), int8 activations (accuracy level 4)
    assert all(len(n.input) == 3 for n in nbits)
    assert {onnx.helper.get_attribute_value(a) for n in nbits for a in n.attribute if a.name == "accuracy_level"} == {4}


def test_residual_adds_join_their_norms(quantized):
    """The quantized graph is onnxruntime-only: each residual Add and the RMSNorm after it are one
    SkipSimplifiedLayerNormalization (every norm but the first), whose fourth output is the sum."""
    graph = onnx.load(str(quantized.folder / "model.onnx")).graph
    layers = quantized.manifest.architecture.num_layers
    skips = [n for n in graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert len(skips) == 2 * layers and all(n.domain == "com.microsoft" for n in skips)
    assert sum(n.op_type == "Pow" for n in graph.node) == 1  # the first norm: onnxruntime fuses it alone
    assert all(len(n.output) == 4 and n.output[3] for n in skips[:-1])  # the next residual Add reads the sum


def test_quantized_graph_keeps_the_contract(quantized):
    folder, manifest = quantized.folder, quantized.manifest
    assert_graph_contract(folder / "model.onnx", manifest.architecture)


def test_manifest_records_quantization(quantized):
    kind, folder, manifest = quantized.kind, quantized.folder, quantized.manifest
    assert manifest.quantization == kind
    assert manifest.graphs["portable"] == "model.onnx"
    figures = manifest.check[f"{kind}_vs_fp"]
    assert figures["reference"] == "unquantized onnx"
    assert figures["positions"] > 0 and 0 <= figures["agreement"] <= 1
    assert math.isfinite(figures["max_logit_diff"]) and figures["max_logit_diff"] > 0
    assert 0 <= figures["text_agreement"] <= 1  # natural text, the figure that predicts generation quality
    assert manifest.check["vs_pytorch"]["agreement"] == 1.0  # the float graph was checked first
    if kind == "int8":  # int8 on the tiny llama agrees on ~98% of random positions; int4 ~70%: reported, not bounded
        assert figures["agreement"] >= 0.9, figures
    files = {p.name for p in folder.iterdir()} - {"jacobi.json"}
    assert set(manifest.files) == files and not any(".int" in name for name in files), files
    assert all(sha256(folder / name) == digest for name, digest in manifest.files.items())


def test_quantized_artifact_runs_in_onnxruntime(quantized, tiny_artifact, hf_model, ort_session):
    folder = quantized.folder
    fp = tiny_artifact(quantized.family)
    session = ort_session(folder)
    for batch, window, past in [(1, 1, 0), (2, 5, 7)]:
        case = hf_case(hf_model(fp.model_dir), batch, window, past, seed=window + past)
        out = run(session, case.feeds)
        assert out["logits"].shape == case.logits.shape and np.isfinite(out["logits"]).all()
        assert np.array_equal(out["greedy_ids"], out["logits"].argmax(-1))
        assert out["present.1.value"].shape == case.present[3].shape
        assert np.abs(out["logits"] - case.logits).max() < 5.0  # close to the float model, if not exact


def portable_bytes(folder: Path) -> int:
    """The portable graph file and the bytes of the external tensors it reads (in the shared weights.data)."""
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    lengths = (int(e.value) for i in model.graph.initializer for e in i.external_data if e.key == "length")
    return (folder / "model.onnx").stat().st_size + sum(lengths)


def test_quantized_graph_smaller(quantized, tiny_artifact):
    kind, folder = quantized.kind, quantized.folder
    fp = tiny_artifact(quantized.family)
    # the embedding (a Gather) stays float, so the tiny model shrinks less than its MatMul weights do
    assert portable_bytes(folder) < portable_bytes(fp.artifact) * (0.6 if kind == "int4" else 0.8)
    # both graphs read one weights file: the artifact holds its weights about once
    assert (folder / "weights.data").stat().st_size < 1.1 * portable_bytes(folder)


def test_quantize_with_external_data(tiny_model, tmp_path):
    """The float graphs are traced with their weights in weights.data (streamed); the pass reads them and
    writes one weights.data of its own that both quantized graphs name, and the float one is gone."""
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.manifest import load_manifest

    out = tmp_path / "external"
    manifest = export(str(tiny_model("llama")), out, ExportOptions(quantize="int4"))
    for graph in dict.fromkeys(manifest.graphs.values()):
        model = onnx.load(str(out / graph), load_external_data=False)
        locations = {e.value for i in model.graph.initializer for e in i.external_data if e.key == "location"}
        assert locations == {"weights.data"}, locations
    assert sorted(p.name for p in out.glob("*.data")) == ["weights.data"] and "weights.data" in manifest.files
    assert not list(out.glob(".*")), "staging left behind"
    load_manifest(out, verify=True)
    result = Generator.load(out).generate([5, 17, 33], max_new_tokens=4)
    assert 1 <= len(result.ids) <= 4
