"""The layer-by-layer export check (exporter/checks/layer_check.py) on tiny stitched 5-layer models."""

from __future__ import annotations

import numpy as np
import pytest

FAMILIES = ["llama", "gpt2", "phi3"]  # gpt2: LayerNorm, Conv1D; phi3: fused qkv and gate_up, partial rotary, tied
LAYERS = 5


@pytest.fixture(scope="module")
def five_layers(tiny_artifact):
    """five_layers(family) -> (model folder, artifact folder): the session's 5-layer export of the family
    (tiny_models' "<family>-5layers": CI's prebuilt one for Llama and GPT-2). check_layers writes its stage
    graphs beside the graph and deletes them; no other test lists those folders."""

    def get(family: str):
        exported = tiny_artifact(f"{family}-{LAYERS}layers")
        return exported.model_dir, exported.artifact

    return get


def _model(folder):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_check_passes_with_the_whole_checks_figures(family, five_layers):
    from jacobi_rt.exporter.checks.check import check_against_torch
    from jacobi_rt.exporter.checks.layer_check import check_layers, layer_scope, stage_count
    from jacobi_rt.exporter.graph.trace import probe

    folder, artifact = five_layers(family)
    model = _model(folder)
    shape = probe(model)
    ticks = []
    report = check_layers(artifact / "model.onnx", model, shape, "float32", progress=lambda: ticks.append(1))
    whole = check_against_torch(model, shape, artifact / "model.onnx", "float32")
    staged = check_against_torch(model, shape, artifact / "model.onnx", "float32", layer_scope=layer_scope(model))
    # the graph run stage by stage: the same figures (gpt2's fused ops round a few 1e-8 differently)
    assert (staged.positions, staged.greedy_agree, staged.near_ties) == (
        whole.positions,
        whole.greedy_agree,
        whole.near_ties,
    )
    assert staged.max_logit_diff == pytest.approx(whole.max_logit_diff, abs=1e-6)
    assert staged.max_present_diff == pytest.approx(whole.max_present_diff, abs=1e-6)
    assert len(ticks) == stage_count(LAYERS) == len(report.stages)
    assert [s["stage"] for s in report.stages] == ["embedding"] + [f"layer {j}" for j in range(LAYERS)] + ["tail"]
    assert report.positions == whole.positions and report.greedy_agree == whole.greedy_agree == whole.positions
    assert report.max_logit_diff == pytest.approx(whole.max_logit_diff, abs=1e-6)
    assert report.max_present_diff == pytest.approx(whole.max_present_diff, abs=1e-6)
    assert all(0 < s["max_abs"] and s["max_hidden_diff"] < 1e-5 for s in report.stages[1:])
    assert report.to_dict()["method"] == "layer by layer"
    assert not list(artifact.glob(".*.check-*.onnx")), "the stage graphs are deleted after use"


def test_a_corrupted_layer_3_weight_is_named(five_layers, tmp_path):
    import onnx
    from onnx import numpy_helper

    from jacobi_rt.exporter.checks.layer_check import check_layers
    from jacobi_rt.exporter.graph.layer_graph import LayerGraph
    from jacobi_rt.exporter.graph.trace import probe
    from jacobi_rt.runtime.errors import ExportCheckError

    folder, artifact = five_layers("llama")
    model = _model(folder)
    graph = LayerGraph(artifact / "model.onnx", LAYERS, "model.model.layers.")
    stages = {s.name: s for s in graph.stages()}
    others = {v for name, s in stages.items() if name != "layer 3" for v in s.initializers}
    weight = next(v for v in stages["layer 3"].initializers if v not in others and len(graph.initializer(v).dims) == 2)
    proto = onnx.load(str(artifact / "model.onnx"))
    for t in proto.graph.initializer:
        if t.name == weight:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 1.05, t.name))
    onnx.save(proto, str(tmp_path / "model.onnx"))
    with pytest.raises(ExportCheckError, match="in layer 3:"):
        check_layers(tmp_path / "model.onnx", model, probe(model), "float32")


def test_one_layer_resident_at_a_time_with_external_data(five_layers, tmp_path):
    """Layers on the meta device, each read in from a saved state dict while it is checked; the
    graph's weights in one external-data file: the figures are the resident model's."""
    import onnx
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from jacobi_rt.exporter.checks.layer_check import check_layers, streamed_layers
    from jacobi_rt.exporter.graph.trace import probe

    folder, artifact = five_layers("qwen2")
    model = _model(folder)
    shape = probe(model)
    expected = check_layers(artifact / "model.onnx", model, shape, "float32")

    onnx.save(
        onnx.load(str(artifact / "model.onnx")),
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
    )
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "weights.safetensors"))
    layers = model.model.layers
    for layer in layers:
        layer.to("meta")
    weights = safe_open(str(tmp_path / "weights.safetensors"), "pt")
    reader, read = streamed_layers(model, lambda name: weights.get_tensor(name).numpy()), []

    def read_layer(j):
        resident = [i for i, layer in enumerate(layers) if not next(layer.parameters()).is_meta]
        assert resident == [], f"layers {resident} resident before layer {j} is read"
        read.append(j)
        return reader(j)

    streamed = check_layers(tmp_path / "model.onnx", model, shape, "float32", read_layer=read_layer)
    assert read == list(range(LAYERS))
    assert all(next(layer.parameters()).is_meta for layer in layers)
    assert streamed.greedy_agree == expected.greedy_agree == expected.positions
    assert streamed.max_logit_diff == pytest.approx(
        expected.max_logit_diff, abs=1e-6
    )  # onnxruntime's threads: not bit-exact
    assert [s["max_hidden_diff"] for s in streamed.stages] == pytest.approx(
        [s["max_hidden_diff"] for s in expected.stages], abs=1e-6
    )
    assert [s["max_abs"] for s in streamed.stages] == pytest.approx([s["max_abs"] for s in expected.stages], rel=1e-6)
    with torch.no_grad(), pytest.raises(Exception):  # noqa: B017 - whatever a meta tensor raises in this torch
        model(torch.zeros(1, 2, dtype=torch.long))  # nothing left resident: the model cannot run whole
    assert np.isfinite(streamed.max_present_diff)
