"""GroupQueryAttention rotating q/k itself and reading q|k|v packed (exporter/attention/gqa_packed.py).

Every tiny family's in-place graph is checked against PyTorch by its export (test_export_inplace.py);
here: which families get which form, and that the rewrite is exact, bit for bit, against the same
graph traced without it (tree windows at past 0 and later, rows of different lengths).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

# family -> (GroupQueryAttention rotates q and k itself, q|k|v come packed)
EXPECTED = {
    "llama": (True, True),
    "llama-mha-tied": (True, True),
    "mistral": (True, True),
    "qwen2": (True, True),  # biased projections: Add(MatMul, Concat(bq, bk, bv))
    "qwen3": (False, False),  # per-head q/k norms sit between the projections and the rotary
    "gpt2": (False, True),  # no rotary; c_attn's Split is undone
}


def test_each_family_gets_the_form_its_attention_allows(exported):
    graph = onnx.load(str(exported.artifact / "model-inplace.onnx"), load_external_data=False).graph
    rotates, packed = EXPECTED[exported.family]
    producer = {o: n for n in graph.node for o in n.output}

    def unpadded(name: str) -> str:  # what gqa_rows.py's Pad (the extra attention row) was given
        node = producer.get(name)
        return node.input[0] if node is not None and node.op_type == "Pad" else name

    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert attention
    for node in attention:
        do_rotary = next((a.i for a in node.attribute if a.name == "do_rotary"), 0)
        assert do_rotary == int(rotates)
        assert (list(node.input[1:3]) == ["", ""]) == packed
        if rotates:
            assert unpadded(node.input[9]) == "position_ids"
    assert any(n.op_type == "RotaryEmbedding" for n in graph.node) == (exported.family == "qwen3")


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_the_rewrite_is_bitwise_the_graph_without_it(family, tiny_model, hf_model, tmp_path, monkeypatch):
    import onnxruntime as ort
    import torch

    from jacobi_rt.exporter.attention.gqa_packed import pack_attention
    from jacobi_rt.exporter.checks.inplace_check import CASES, SLACK, _row_case, inplace_feeds
    from jacobi_rt.exporter.graph import inplace
    from jacobi_rt.exporter.graph.trace import probe

    model = hf_model(tiny_model(family))
    model.set_attn_implementation("eager")
    shape = probe(model)
    monkeypatch.setattr(inplace, "pack_attention", lambda onnx_model: None)
    unpacked = tmp_path / "unpacked.onnx"
    inplace.export_inplace_onnx(model, shape, unpacked, 18, extra_row=False)  # packing alone
    graph = onnx.load(str(unpacked))
    report = pack_attention(graph)
    assert report.packed == shape.num_layers and report.rotary == (0 if family == "gpt2" else shape.num_layers)
    packed = tmp_path / "packed.onnx"
    onnx.save(graph, str(packed))
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (unpacked, packed)]
    for seed, (lengths, window) in enumerate(CASES + [((0, 0), 6)]):  # tree windows at past 0 too
        g = torch.Generator().manual_seed(seed)
        rows = [_row_case(model, shape, length, window, g) for length in lengths]
        feeds = inplace_feeds(rows, shape, max(lengths) + window + SLACK, g)
        before, after = (s.run(None, {k: v.copy() for k, v in feeds.items()}) for s in sessions)
        for b, r in enumerate(rows):
            written = r["length"] + window
            np.testing.assert_array_equal(after[0][b], before[0][b])  # logits
            for x, y in zip(after[2:], before[2:]):
                np.testing.assert_array_equal(x[b, :, :written], y[b, :, :written])
