"""Layers written by exporter/graph/stitch.py: the same graph as tracing them all, or every layer traced.

A tiny Llama of 4 layers (3 traced, 1 written) is exported both ways and the two graphs compared
node for node by what each output computes (op, attributes, inputs, weights' bytes; the names
differ), then checked against PyTorch like any export. Models whose layers differ are traced
whole: decided before tracing from the modules' settings, and failing that by the proof (layer 2
against layer 1), shown on a per-layer constant in GPT-2's graph.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
import torch
from tiny_models import tiny_config


def _model(family: str, layers: int, **fields):
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(config, key):
            setattr(config, key, layers)
    for key, value in fields.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # every layer its own weights, norms included (random init leaves them all ones)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def computations(path) -> tuple[list[int], Counter]:
    """What each graph output computes, as numbers equal for equal computations whatever the names,
    and the op counts."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    ids: dict = {}
    key = {i.name: ids.setdefault(("input", i.name), len(ids)) for i in graph.input}
    for t in graph.initializer:
        a = numpy_helper.to_array(t)
        key[t.name] = ids.setdefault(
            ("weight", a.dtype.str, a.shape, hashlib.sha256(a.tobytes()).hexdigest()), len(ids)
        )
    for n in graph.node:
        attributes = tuple(sorted((a.name, a.SerializeToString()) for a in n.attribute))
        inputs = tuple(key[x] if x else None for x in n.input)
        for index, out in enumerate(n.output):
            key[out] = ids.setdefault((n.domain, n.op_type, attributes, inputs, index), len(ids))
    return [key[o.name] for o in graph.output], Counter(n.op_type for n in graph.node)


def _export(kind: str, model, shape, path, monkeypatch, whole: bool) -> str:
    from jacobi_rt.exporter.graph import inplace, trace

    with monkeypatch.context() as patch:
        if whole:
            patch.setattr(trace, "layers_to_trace", lambda model, n: (n, "whole, for the comparison"))
        if kind == "portable":
            return trace.export_onnx(model, shape, path, 18)
        return inplace.export_inplace_onnx(model, shape, path, 18, inplace.attention_form(shape))


@pytest.mark.parametrize("kind", ["portable", "inplace"])
def test_written_layers_are_the_graph_a_full_trace_makes(kind, tmp_path, monkeypatch):
    from jacobi_rt.exporter.checks.check import check_against_torch
    from jacobi_rt.exporter.checks.inplace_check import check_inplace_against_torch
    from jacobi_rt.exporter.graph.trace import probe

    model = _model("llama", 4)
    shape = probe(model)
    how = _export(kind, model, shape, tmp_path / "written.onnx", monkeypatch, whole=False)
    assert how == "traced 3 of 4 layers, wrote the other 1"
    _export(kind, model, shape, tmp_path / "traced.onnx", monkeypatch, whole=True)
    written, traced = computations(tmp_path / "written.onnx"), computations(tmp_path / "traced.onnx")
    assert written[1] == traced[1]
    assert written[0] == traced[0], "the written graph computes something else than the traced one"
    check = check_against_torch if kind == "portable" else check_inplace_against_torch
    report = check(model, shape, tmp_path / "written.onnx", "float32")
    assert report.greedy_agree + report.near_ties == report.positions and report.max_logit_diff < 1e-4


@pytest.mark.parametrize(
    "family,fields,why",
    [
        ("gemma2", {"layer_types": ["sliding_attention", "full_attention"] * 3}, "differs from layer 2"),
        ("smollm3", {"no_rope_layers": [1, 1, 1, 1, 0, 1]}, "layer 4 differs from layer 2"),
    ],
)
def test_unlike_layers_are_traced_whole(family, fields, why):
    from jacobi_rt.exporter.graph.stitch import layers_to_trace

    model = _model(family, 6, **fields)
    layers, reason = layers_to_trace(model, 6)
    assert layers == 6 and why in reason, reason


class WholeTrace(Exception):
    """Raised in place of the whole trace the export falls back to (the test stops there)."""


def test_a_layer_index_in_the_graph_fails_the_proof(monkeypatch, tmp_path):
    """GPT-2 scaling attention by 1 / (layer index + 1): refused from its modules' settings; past
    them (patched away here) the proof sees the per-layer constant, and the export traces every layer."""
    from jacobi_rt.exporter.graph import trace
    from jacobi_rt.exporter.graph.stitch import NotStitchable, layers_to_trace

    model = _model("gpt2", 4, scale_attn_by_inverse_layer_idx=True)
    shape = trace.probe(model)
    assert layers_to_trace(model, 4) == (4, "layer 1 differs from layer 2 in its modules or settings")
    monkeypatch.setattr(trace, "layers_to_trace", lambda model, n: (3, None))
    refusals, extend, traced = [], trace.extend_layers, trace._onnx_program

    def proved(*args, **kwargs):
        try:
            return extend(*args, **kwargs)
        except NotStitchable as exc:
            refusals.append(str(exc))
            raise

    def program(wrapper, inputs, dynamic_shapes, opset, num_layers, variant, table, optimize):
        if num_layers == 4:  # the fallback, a whole trace as before (test_export_graph covers that path)
            raise WholeTrace
        return traced(wrapper, inputs, dynamic_shapes, opset, num_layers, variant, table, optimize)

    monkeypatch.setattr(trace, "extend_layers", proved)
    monkeypatch.setattr(trace, "_onnx_program", program)
    with pytest.raises(WholeTrace):
        trace.export_onnx(model, shape, tmp_path / "model.onnx", 18)
    assert len(refusals) == 1 and ("counterpart" in refusals[0] or "is not layer 1's" in refusals[0]), refusals
