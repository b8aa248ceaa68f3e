"""fp16 export of a tiny model, and whether onnxruntime's CPU provider runs an fp16 window graph.

Findings (torch 2.13, onnxruntime 1.32, CPU): the fp16 graph loads and runs on the CPU provider
and agrees with the fp32 HF model to ~1e-2 in logits with identical greedy ids; the export's own
check compares it with the fp16 PyTorch model.
"""

from __future__ import annotations

import numpy as np
import pytest
from export_helpers import assert_graph_contract, assert_greedy_equal, hf_case, run

FP16_TOL = 5e-2  # the exporter's own fp16 tolerance


@pytest.fixture(scope="module")
def fp16_graph(tiny_model, tmp_path_factory):
    """The window graph of the tiny llama traced in fp16 with the exporter's own steps (load, probe, trace)."""
    from jacobi_rt.exporter import sources
    from jacobi_rt.exporter.graph.trace import export_onnx, probe

    source = sources.resolve(str(tiny_model("llama")))
    model, _ = sources.load(source, "float16")
    shape = probe(model)
    path = tmp_path_factory.mktemp("fp16") / "model.onnx"
    export_onnx(model, shape, path, 18)
    return path, shape


def test_fp16_graph_has_fp16_kv_and_fp32_logits(fp16_graph):
    from jacobi_rt.runtime.manifest import Architecture

    path, shape = fp16_graph
    arch = Architecture(
        family="llama",
        **{
            k: getattr(shape, k)
            for k in ("num_layers", "num_heads", "kv_heads", "head_dim", "hidden_size", "vocab_size", "max_positions")
        },
    )
    assert_graph_contract(path, arch, kv_type="FLOAT16")


@pytest.mark.parametrize("batch,window,past", [(1, 1, 0), (1, 5, 9), (2, 3, 4)])
def test_onnxruntime_cpu_runs_fp16_graph(fp16_graph, tiny_model, hf_model, batch, window, past):
    import onnxruntime as ort

    path, _ = fp16_graph
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    case = hf_case(hf_model(tiny_model("llama")), batch, window, past, seed=window * 31 + past)
    feeds = {k: (v.astype(np.float16) if k.startswith("past_key_values.") else v) for k, v in case.feeds.items()}
    out = run(session, feeds)
    assert out["logits"].dtype == np.float32 and out["present.0.key"].dtype == np.float16
    np.testing.assert_allclose(out["logits"], case.logits, atol=FP16_TOL, rtol=FP16_TOL)
    assert_greedy_equal(out["greedy_ids"], case.logits)
    for name, expected in zip([k for k in out if k.startswith("present.")], case.present):
        np.testing.assert_allclose(out[name].astype(np.float32), expected, atol=FP16_TOL, rtol=FP16_TOL, err_msg=name)


def test_export_fp16(tiny_model, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    manifest = export(str(tiny_model("llama")), tmp_path / "fp16", ExportOptions(dtype="fp16"))
    assert manifest.dtype == "float16"
    report = manifest.check["vs_pytorch"]
    assert report["max_logit_diff"] < report["tolerance"] and report["agreement"] == 1.0
    assert_graph_contract(tmp_path / "fp16" / "model.onnx", manifest.architecture, kv_type="FLOAT16")
