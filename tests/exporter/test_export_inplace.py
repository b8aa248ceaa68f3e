"""The in-place graph (GroupQueryAttention over a fixed-capacity cache) against PyTorch, every tiny family."""

from __future__ import annotations

import numpy as np


def test_the_artifact_has_both_graphs_and_the_inplace_check(exported):
    manifest = exported.manifest
    assert manifest.graphs == {"portable": "model.onnx", "inplace": "model-inplace.onnx"}
    assert "model-inplace.onnx" in manifest.files
    check = manifest.check["inplace"]
    assert check["agreement"] == 1.0
    assert check["max_logit_diff"] <= check["tolerance"]
    assert {s["past"] for s in check["shapes"] if s["batch"] == 2} >= {6, 3}  # rows of different lengths were checked


def test_one_group_query_attention_per_layer_and_the_contract_axes(exported):
    import onnx

    model = onnx.load(str(exported.artifact / "model-inplace.onnx"), load_external_data=False)
    assert exported.manifest.check["inplace"]["attention"] == "gqa"
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    assert len(gqa) == exported.manifest.architecture.num_layers
    assert not [
        n for n in model.graph.node if n.op_type == "Concat" and any(i.startswith("past_key_values") for i in n.input)
    ]
    axes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    arch = exported.manifest.architecture
    assert axes["cache_lengths"] == ["batch"]
    assert axes["attention_mask"] == ["batch", "total"]
    assert axes["past_key_values.0.key"] == ["batch", arch.kv_heads, "capacity", arch.head_dim]
    outputs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output}
    assert outputs["present.0.value"] == ["batch", arch.kv_heads, "capacity", arch.head_dim]
    # onnxruntime-only already: each residual Add and its RMSNorm are one node (GPT-2's LayerNorm aside)
    skips = sum(n.op_type == "SkipSimplifiedLayerNormalization" for n in model.graph.node)
    assert skips == (0 if exported.family == "gpt2" else 2 * arch.num_layers)
    # the rewrites leave no constant behind (onnxruntime would warn about each on every load)
    read = {name for node in model.graph.node for name in node.input}
    assert [i.name for i in model.graph.initializer if i.name not in read] == []


def test_the_scatter_form_also_matches_pytorch(tiny_model, hf_model, tmp_path):
    """The standard-op translation (an export option: in-place ScatterND, attention over the capacity)."""
    import onnx

    from jacobi_rt.exporter.checks.inplace_check import check_inplace_against_torch
    from jacobi_rt.exporter.graph.inplace import export_inplace_onnx
    from jacobi_rt.exporter.graph.trace import probe

    model = hf_model(tiny_model("qwen2"))
    model.set_attn_implementation("eager")
    shape = probe(model)
    path = tmp_path / "scatter.onnx"
    export_inplace_onnx(model, shape, path, 18, attention="scatter")
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    assert sum(n.op_type == "ScatterND" for n in nodes) == 2 * shape.num_layers  # keys and values, per layer
    assert not any(n.op_type == "GroupQueryAttention" for n in nodes)
    report = check_inplace_against_torch(model, shape, path, "float32")
    assert report.greedy_agree == report.positions and report.max_logit_diff < 1e-4


def test_windows_1_to_16_with_branches_and_rows_of_different_lengths_match_pytorch(exported, hf_model):
    from jacobi_rt.exporter.checks.inplace_check import check_inplace_against_torch
    from jacobi_rt.exporter.checks.layer_check import layer_scope
    from jacobi_rt.exporter.graph.trace import probe

    model = hf_model(exported.model_dir)
    model.set_attn_implementation("eager")
    # two rows (lengths 11 and 4) per window, a two-branch mask from window 4 on; plus an empty row beside a long one
    cases = [((11, 4), w) for w in range(1, 17)] + [((0, 9), 6)]
    report = check_inplace_against_torch(
        model, probe(model), exported.artifact / "model-inplace.onnx", "float32", cases=cases
    )
    assert report.positions == sum(len(lengths) * w for lengths, w in cases)
    assert report.greedy_agree == report.positions
    assert report.max_logit_diff < 1e-4 and report.max_present_diff < 1e-4
    # run stage by stage (as past budget.STAGED_ABOVE of weights), the graph gives the same figures
    # (within float rounding)
    staged = check_inplace_against_torch(
        model,
        probe(model),
        exported.artifact / "model-inplace.onnx",
        "float32",
        cases=cases,
        layer_scope=layer_scope(model),
    )
    assert (staged.positions, staged.greedy_agree) == (report.positions, report.greedy_agree)
    assert (
        abs(staged.max_logit_diff - report.max_logit_diff) < 1e-6
        and abs(staged.max_present_diff - report.max_present_diff) < 1e-6
    )


def test_multi_query_attention_in_place_matches_pytorch_and_decodes_like_greedy(tiny_artifact, hf_model):
    """One KV head for all query heads (MQA), the attention layout FAMILIES lacks: the graph against
    PyTorch at windows 1-16 with branches and rows of different lengths, then every strategy on it."""
    from jacobi_rt.exporter.checks.inplace_check import check_inplace_against_torch
    from jacobi_rt.exporter.graph.trace import probe
    from jacobi_rt.runtime import Generator

    mqa = tiny_artifact("llama-mqa")
    assert mqa.manifest.architecture.kv_heads == 1 and "inplace" in mqa.manifest.graphs
    model = hf_model(mqa.model_dir)
    model.set_attn_implementation("eager")
    cases = [((11, 4), w) for w in range(1, 17)] + [((0, 9), 6)]
    report = check_inplace_against_torch(
        model, probe(model), mqa.artifact / "model-inplace.onnx", "float32", cases=cases
    )
    assert report.greedy_agree == report.positions == sum(len(lengths) * w for lengths, w in cases)
    assert report.max_logit_diff < 1e-4 and report.max_present_diff < 1e-4
    generator = Generator.load(mqa.artifact, threads=1)
    assert generator.backend.graph == "inplace"
    prompt = [5, 17, 33, 90, 5, 17, 33]
    greedy = generator.generate(prompt, max_new_tokens=24, strategy="greedy").ids
    for strategy in ("jacobi", "lookahead"):
        assert generator.generate(prompt, max_new_tokens=24, strategy=strategy).ids == greedy, strategy


def test_the_custom_ops_eager_body_is_the_portable_attention(exported, hf_model):
    """The in-place window model in PyTorch (jacobi::gqa's eager body) against the portable one."""
    import torch

    from jacobi_rt.exporter.checks.inplace_check import _row_case, inplace_feeds
    from jacobi_rt.exporter.graph.inplace import InplaceWindowModel, inplace_attention_for
    from jacobi_rt.exporter.graph.trace import probe
    from jacobi_rt.exporter.graph.window_model import WindowModel

    model = hf_model(exported.model_dir)
    model.set_attn_implementation("eager")
    shape = probe(model)
    g = torch.Generator().manual_seed(3)
    rows = [_row_case(model, shape, length, 6, g) for length in (7, 2)]
    feeds = {k: torch.from_numpy(v) for k, v in inplace_feeds(rows, shape, 20, g).items()}
    with torch.no_grad(), inplace_attention_for(model):
        got = InplaceWindowModel(model, shape.num_layers)(*feeds.values())
    for b, r in enumerate(rows):
        with torch.no_grad():
            want = WindowModel(model, shape.num_layers)(
                r["ids"], r["positions"], torch.ones(1, r["length"] + 6, dtype=torch.long), r["mask"], *r["kv"]
            )
        np.testing.assert_allclose(got[0][b : b + 1].numpy(), want[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(got[2][b : b + 1, :, : r["length"] + 6].numpy(), want[2].numpy(), atol=1e-5)


def test_a_head_size_gqa_cannot_take_gets_the_scatter_form_and_uneven_groups_the_portable_graph():
    from jacobi_rt.exporter.graph.inplace import attention_form, unsupported
    from jacobi_rt.exporter.graph.trace import ModelShape

    for head_dim in (8, 12):  # onnxruntime's GroupQueryAttention: "head_size shall be a multiple of 16"
        odd = ModelShape(
            num_layers=2,
            num_heads=4,
            kv_heads=2,
            head_dim=head_dim,
            hidden_size=4 * head_dim,
            vocab_size=10,
            max_positions=8,
        )
        assert unsupported(odd) is None and attention_form(odd) == "scatter"
    assert attention_form(ModelShape(2, 4, 2, 16, 64, 10, 8)) == "gqa"
    assert "multiple of" in unsupported(ModelShape(2, 5, 2, 16, 80, 10, 8))
    assert unsupported(ModelShape(2, 4, 2, 16, 64, 10, 8)) is None


def test_export_can_leave_the_inplace_graph_out(tiny_model, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    manifest = export(str(tiny_model("llama")), tmp_path / "llama", ExportOptions(inplace=False))
    assert manifest.graphs == {"portable": "model.onnx"}
    assert not (tmp_path / "llama" / "model-inplace.onnx").exists()
