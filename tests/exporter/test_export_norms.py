"""RMSNorm is exported in standard ops that onnxruntime fuses into SimplifiedLayerNormalization."""

from __future__ import annotations

import collections

import onnx


def optimized_ops(graph_path, tmp_path) -> collections.Counter:
    """Op counts of the graph as onnxruntime runs it (ORT_ENABLE_ALL, as the runtime loads it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")  # its weights stay in the artifact's file
    ort.InferenceSession(str(graph_path), options, providers=["CPUExecutionProvider"])
    return collections.Counter(
        n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node
    )


def test_every_rms_norm_fuses_in_onnxruntime(exported, tmp_path):
    graph = onnx.load(str(exported.artifact / "model.onnx")).graph
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}, "the portable graph must stay standard ONNX"
    if exported.family == "gpt2":  # LayerNorm, one standard node already (its Pows are gelu's x^3)
        return
    norms = sum(n.op_type == "Pow" for n in graph.node)  # one Pow per RMSNorm (x^2), none elsewhere
    ops = optimized_ops(exported.artifact / "model.onnx", tmp_path)
    layers = exported.manifest.architecture.num_layers
    assert norms >= 2 * layers + 1  # before attention, before the MLP, the final norm (Qwen3: q/k norms too)
    assert ops["SimplifiedLayerNormalization"] == norms and ops["Pow"] == 0
