"""Traced rotary -> com.microsoft.RotaryEmbedding (exporter/graph/rotary.py) and GroupQueryAttention's 3-D
inputs (exporter/attention/gqa_layout.py): where they fire, what they leave alone, and that nothing changes
but the node count."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jacobi_rt.exporter.graph.rotary import fuse_rotary


def session(model):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ops(model, op: str) -> list:
    return [n for n in model.graph.node if n.op_type == op]


def branch_feeds(arch, past: int = 5, window: int = 6) -> dict:
    """Two rows, a past of real-looking noise, a two-branch window (positions repeat)."""
    rng = np.random.default_rng(0)
    half = window // 2
    positions = np.concatenate([np.arange(past, past + half), np.arange(past, past + window - half)])
    mask = np.tril(np.ones((window, window), bool))
    mask[half:, :half] = False
    feeds = {
        "input_ids": rng.integers(0, arch.vocab_size, (2, window)),
        "position_ids": np.stack([positions, positions + 3]),
        "attention_mask": np.ones((2, past + window), np.int64),
        "window_mask": np.stack([mask, mask]),
    }
    for i in range(arch.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((2, arch.kv_heads, past, arch.head_dim)).astype(
                np.float32
            )
    return feeds


def test_the_rewrite_equals_the_traced_portable_graph(exported):
    """The traced portable graph rewritten (what the weight pass does), against itself in onnxruntime."""
    arch = exported.manifest.architecture
    traced = onnx.load(str(exported.artifact / "model.onnx"))
    rewritten = onnx.load(str(exported.artifact / "model.onnx"))
    report = fuse_rotary(rewritten, arch.max_positions)
    if exported.family == "gpt2":  # learned positions: nothing to fuse, the graph as it was
        assert report.fused == 0 and report.skipped == {}
        assert rewritten.SerializeToString() == traced.SerializeToString()
        return
    assert report.fused == 2 * arch.num_layers and report.skipped == {}  # every query and key
    assert len(ops(rewritten, "RotaryEmbedding")) == 2 * arch.num_layers
    assert not ops(rewritten, "Cos") and not ops(rewritten, "Sin") and not ops(rewritten, "Neg")
    feeds = branch_feeds(arch)
    before, after = session(traced).run(None, feeds), session(rewritten).run(None, feeds)
    assert np.abs(before[0] - after[0]).max() < 1e-4
    assert max(np.abs(a - b).max() for a, b in zip(before[2:], after[2:])) < 1e-4


def test_the_inplace_graph_feeds_group_query_attention_directly(exported):
    """The gqa form is rewritten right after its trace (its export check covers it): q/k/v reach
    GroupQueryAttention without a Transpose or a Reshape, and where the family allows it the attention
    rotates them itself (gqa_packed.py; Qwen3's q/k norms keep two RotaryEmbedding per layer)."""
    arch = exported.manifest.architecture
    model = onnx.load(str(exported.artifact / "model-inplace.onnx"), load_external_data=False)
    producer = {o: n for n in model.graph.node for o in n.output}
    rotary = ops(model, "RotaryEmbedding")
    assert len(rotary) == (2 * arch.num_layers if exported.family == "qwen3" else 0)
    assert not ops(model, "Cos") and not ops(model, "Neg")
    for gqa in ops(model, "GroupQueryAttention"):
        fed_by = {producer[name].op_type for name in gqa.input[:3] if name}
        # qwen3's q/k norms sit between; GPT-2's packed c_attn output is its Conv1D's own reshape to [B, W, 3 * hidden]
        assert not fed_by & {"Transpose", "Reshape"} or exported.family in ("qwen3", "gpt2"), fed_by
        rotates = dict((a.name, a.i) for a in gqa.attribute).get("do_rotary", 0) == 1
        assert rotates == (exported.family not in ("gpt2", "qwen3"))


def test_quantized_graphs_get_rotary_too(tiny_model, tmp_path):
    """The weight pass's graphs are onnxruntime-only: their portable graph's rotary is fused as well."""
    from jacobi_rt.exporter import ExportOptions, export

    manifest = export(str(tiny_model("llama")), tmp_path / "int4", ExportOptions(quantize="int4"))
    model = onnx.load(str(tmp_path / "int4" / "model.onnx"))
    assert len(ops(model, "RotaryEmbedding")) == 2 * manifest.architecture.num_layers and not ops(model, "Neg")


# Hand-made graphs: the pattern alone, to see each way a family is detected as not mappable.
HEADS, SEQ, DIM = 2, 3, 8


def rope_graph(rotated: int = DIM, head_dim: int = DIM, second_half: float = 1.0, cos_reads: str | None = None):
    """y = x * cos + rotate_half(x) * sin over the last `rotated` values of x [1, HEADS, SEQ, rotated],
    cos/sin = Cos/Sin(Concat(f, second_half * f)), f = position * inv_freq (+ the input `cos_reads`)."""
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotated, 2) / rotated)).astype(np.float32)
    half = rotated // 2
    const = lambda name, v: numpy_helper.from_array(np.array(v), name)  # noqa: E731
    nodes = [
        helper.make_node("Unsqueeze", ["position_ids", "minus1"], ["p3"]),
        helper.make_node("Cast", ["p3"], ["pf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["pf", "inv_freq"], ["f" if cos_reads is None else "f0"]),
        helper.make_node("Mul", ["f", "second_half"], ["f2"]),
        helper.make_node("Concat", ["f", "f2"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["cos"]),
        helper.make_node("Sin", ["emb"], ["sin"]),
        helper.make_node("Unsqueeze", ["cos", "one"], ["cos4"]),
        helper.make_node("Unsqueeze", ["sin", "one"], ["sin4"]),
        helper.make_node("Mul", ["x", "cos4"], ["a"]),
        helper.make_node("Slice", ["x", "zero", "half", "minus1", "one"], ["x1"]),
        helper.make_node("Slice", ["x", "half", "big", "minus1", "one"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["n"]),
        helper.make_node("Concat", ["n", "x1"], ["r"], axis=-1),
        helper.make_node("Mul", ["r", "sin4"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    inputs = [
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, SEQ]),
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HEADS, SEQ, rotated]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, [1, HEADS, 0, head_dim]),
    ]
    if cos_reads is not None:
        nodes.insert(3, helper.make_node("Add", ["f0", cos_reads], ["f"]))
        inputs.append(helper.make_tensor_value_info(cos_reads, TensorProto.FLOAT, [1, 1, 1]))
    initializers = [
        const("minus1", [-1]),
        const("one", [1]),
        const("zero", [0]),
        const("half", [half]),
        const("big", [2**62]),
        numpy_helper.from_array(inv_freq, "inv_freq"),
        numpy_helper.from_array(np.float32(second_half), "second_half"),
    ]
    graph = helper.make_graph(
        nodes,
        "rope",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
        value_info=[
            helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
            for n, s in (("cos", [1, SEQ, rotated]), ("sin", [1, SEQ, rotated]))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


def test_the_hand_made_pattern_fuses_exactly():
    model = rope_graph()
    rewritten = rope_graph()
    assert fuse_rotary(rewritten, 64).fused == 1
    assert [n.op_type for n in rewritten.graph.node] == ["RotaryEmbedding"]
    feeds = {
        "position_ids": np.array([[5, 6, 5]]),
        "x": np.random.default_rng(0).standard_normal((1, HEADS, SEQ, DIM)).astype(np.float32),
        "past_key_values.0.key": np.zeros((1, HEADS, 0, DIM), np.float32),
    }
    assert np.abs(session(model).run(None, feeds)[0] - session(rewritten).run(None, feeds)[0]).max() < 1e-6


@pytest.mark.parametrize(
    "variant, why",
    [
        (dict(rotated=4, head_dim=8), "rotates [4] of a 8-wide head"),  # partial rotary: the rest of the head unrotated
        (dict(second_half=2.0), "halves differ"),  # not rotate-half
        (dict(cos_reads="attention_bias"), "more than position_ids"),  # cos/sin that depend on something else
    ],
)
def test_what_it_cannot_map_is_left_alone(variant, why):
    model = rope_graph(**variant)
    before = model.SerializeToString()
    report = fuse_rotary(model, 64)
    assert report.fused == 0 and why in next(iter(report.skipped.values()))
    assert model.SerializeToString() == before
