"""The exported window graph, per tiny family: the contract's I/O, and onnxruntime vs the HF model itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from export_helpers import assert_graph_contract, assert_greedy_equal, hf_case, presents, run

# (batch, window, past, left-padded row): window 1 and past 0 included.
SHAPES = [(1, 1, 0, False), (1, 1, 7, False), (1, 6, 0, False), (2, 4, 6, False), (3, 1, 12, False), (2, 7, 5, True)]
LOGIT_TOL = 1e-4
KV_TOL = 1e-5


def test_graph_matches_contract(exported):
    path = exported.artifact / "model.onnx"
    onnx.checker.check_model(str(path))
    assert_graph_contract(path, exported.manifest.architecture)


def test_onnxruntime_sees_contract_types(exported, ort_session):
    session = ort_session(exported.artifact)
    types = {i.name: i.type for i in session.get_inputs()} | {o.name: o.type for o in session.get_outputs()}
    assert types["input_ids"] == types["position_ids"] == types["attention_mask"] == "tensor(int64)"
    assert types["window_mask"] == "tensor(bool)"
    assert types["logits"] == "tensor(float)" and types["greedy_ids"] == "tensor(int64)"
    assert {t for n, t in types.items() if n.startswith(("past_key_values.", "present."))} == {"tensor(float)"}
    assert session.get_inputs()[0].shape == ["batch", "window"]
    assert session.get_inputs()[2].shape == ["batch", "total"]


@pytest.mark.parametrize(
    "batch,window,past,pad", SHAPES, ids=[f"b{b}-w{w}-p{p}{'-pad' if d else ''}" for b, w, p, d in SHAPES]
)
def test_onnx_matches_hf_forward(exported, hf_model, ort_session, batch, window, past, pad):
    model = hf_model(exported.model_dir)
    case = hf_case(model, batch, window, past, seed=100 * batch + 10 * window + past, pad_row=pad)
    out = run(ort_session(exported.artifact), case.feeds)

    arch = exported.manifest.architecture
    assert out["logits"].shape == (batch, window, arch.vocab_size) and out["logits"].dtype == np.float32
    assert out["greedy_ids"].shape == (batch, window) and out["greedy_ids"].dtype == np.int64
    np.testing.assert_allclose(out["logits"], case.logits, atol=LOGIT_TOL, rtol=LOGIT_TOL)
    assert_greedy_equal(out["greedy_ids"], case.logits)
    assert np.array_equal(out["greedy_ids"], out["logits"].argmax(-1))  # in-graph argmax of its own logits

    got = presents(out)
    assert len(got) == len(case.present) == 2 * arch.num_layers
    for i, (g, e) in enumerate(zip(got, case.present)):
        assert g.shape == (batch, arch.kv_heads, past + window, arch.head_dim), f"present {i}"
        np.testing.assert_allclose(g, e, atol=KV_TOL, rtol=KV_TOL, err_msg=f"present {i}")


def test_one_session_serves_many_shapes(exported, hf_model, ort_session):
    """Dynamic axes are really dynamic: one session, shapes up and down in a row, each still right."""
    model = hf_model(exported.model_dir)
    session = ort_session(exported.artifact)
    arch = exported.manifest.architecture
    sequence = [(1, 1, 0), (3, 9, 20), (1, 1, 1), (2, 4, 0), (1, 16, 3), (2, 1, 40), (4, 2, 2), (1, 1, 0)]
    for n, (batch, window, past) in enumerate(sequence):
        case = hf_case(model, batch, window, past, seed=7000 + n)
        out = run(session, case.feeds)
        assert out["logits"].shape == (batch, window, arch.vocab_size)
        assert out["present.0.key"].shape == (batch, arch.kv_heads, past + window, arch.head_dim)
        np.testing.assert_allclose(
            out["logits"], case.logits, atol=LOGIT_TOL, rtol=LOGIT_TOL, err_msg=str((batch, window, past))
        )
        assert_greedy_equal(out["greedy_ids"], case.logits, where=f"{(batch, window, past)}: ")


def test_greedy_decode_loop_feeding_present_back(exported, hf_model, ort_session):
    """Prefill a prompt, then decode one token per pass with present -> past: same tokens as HF greedy
    recomputed from scratch each step (no cache), so the KV the graph returns is the KV it expects."""
    import torch

    model = hf_model(exported.model_dir)
    session = ort_session(exported.artifact)
    layers = exported.manifest.architecture.num_layers
    prompt = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))

    expected = prompt.clone()
    with torch.no_grad():
        for _ in range(12):
            logits = model(input_ids=expected).logits
            expected = torch.cat([expected, logits[:, -1:].argmax(-1)], dim=1)

    ids = prompt.numpy()
    past = {
        f"past_key_values.{i}.{k}": np.zeros(
            (1, exported.manifest.architecture.kv_heads, 0, exported.manifest.architecture.head_dim), np.float32
        )
        for i in range(layers)
        for k in ("key", "value")
    }
    window, start, tokens = ids, 0, list(ids[0])
    for _ in range(12):
        w = window.shape[1]
        out = run(
            session,
            {
                "input_ids": window,
                "position_ids": np.arange(start, start + w)[None],
                "attention_mask": np.ones((1, start + w), np.int64),
                "window_mask": np.tril(np.ones((w, w), bool))[None],
                **past,
            },
        )
        nxt = int(out["greedy_ids"][0, -1])
        tokens.append(nxt)
        past = {f"past_key_values.{i}.{k}": out[f"present.{i}.{k}"] for i in range(layers) for k in ("key", "value")}
        start += w
        window = np.array([[nxt]], np.int64)
    assert tokens == expected[0].tolist()
