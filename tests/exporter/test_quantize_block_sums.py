"""The Q4_1 offset term with the block sums as extra MatMulNBits output columns (quantize.BLOCK_SUMS).

One MatMul of a small graph rewritten by the weight pass, run in onnxruntime: the result is
x @ W.T for the exact Q4_1 weights (level 0), the form has no Reshape/ReduceSum, and at level 4
each row of a window is bitwise the row in any pass of two or more rows (what keeps chain windows
equal to one-token passes, padded where the CPU needs it).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jacobi_rt.exporter.weights import quantize
from jacobi_rt.exporter.weights.blocks import BLOCK, BlockMatrix

K, N = 4 * BLOCK, 48


def q4_1(seed: int = 0) -> BlockMatrix:
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (N, K)).astype(np.uint8)
    d = (rng.random((N, K // BLOCK)) * 0.05 + 0.01).astype(np.float32)
    m = (-rng.random((N, K // BLOCK)) * 0.3).astype(np.float32)
    return BlockMatrix("Q4_1", 4, BLOCK, q, d, offsets=m + np.float32(8) * d)


def graph(m: BlockMatrix, form: str, level: int, monkeypatch) -> onnx.ModelProto:
    """x [1, rows, K] -> MatMul(x, W.T) -> y, then the weight pass with the block sums in `form`."""
    weight = numpy_helper.from_array(np.ascontiguousarray(m.dequantize().T), "w")
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", K])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "rows", N])],
            [weight],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    model.graph.value_info.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "rows", K]))
    monkeypatch.setattr(quantize, "BLOCK_SUMS", form)
    quantize.rewrite(model, {"w": m}, set(), level)
    return model


def run(model, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_columns_are_the_weights_and_the_block_sums():
    m = q4_1()
    joined = quantize.with_block_sums(m)
    w = joined.dequantize()
    first = BlockMatrix(m.kind, m.bits, m.block, m.q, m.scales).dequantize()  # d * (q - 8)
    assert np.array_equal(w[:N], first) and joined.offsets is None
    x = np.random.default_rng(1).standard_normal(K)
    assert np.allclose(w[N:].astype(np.float64) @ x, x.reshape(-1, BLOCK).sum(axis=1))


@pytest.mark.parametrize("form", ["columns", "reduce"])
def test_the_offset_form_is_the_exact_weights(form, monkeypatch):
    m = q4_1()
    model = graph(m, form, 0, monkeypatch)
    ops = [n.op_type for n in model.graph.node]
    assert ("ReduceSum" in ops) == (form == "reduce") and ops.count("MatMulNBits") == 1
    x = np.random.default_rng(2).standard_normal((1, 5, K)).astype(np.float32)
    expected = x.astype(np.float64) @ m.dequantize().T.astype(np.float64)
    assert np.abs(run(model, x) - expected).max() < 1e-4  # level 0: float activations, the weights exact


def test_rows_of_a_window_are_bitwise_rows_alone_at_level_4(monkeypatch):
    """What runtime/backends/exact_rows.py relies on: a row is the same bits in every pass that leaves no
    one-row MatMulNBits tile; a row alone is padded to two rows, as the runtime pads it (an AVX2-only
    CPU runs a one-row tile on another kernel: tests/runtime/test_exact_rows.py emulates one)."""
    from jacobi_rt.runtime.backends.exact_rows import needs_pad

    model = graph(q4_1(), "columns", 4, monkeypatch)
    x = np.random.default_rng(3).standard_normal((1, 8, K)).astype(np.float32)
    window = run(model, x)
    assert needs_pad(1, 1) and needs_pad(1, 129)
    for row in range(8):
        padded = np.repeat(x[:, row : row + 1], 2, axis=1)
        assert np.array_equal(window[0, row], run(model, padded)[0, 0]), f"row {row}"
    wide = np.random.default_rng(4).standard_normal((1, 129, K)).astype(np.float32)  # two threads: 128 rows + 1
    padded = run(model, np.concatenate([wide, wide[:, -1:]], axis=1))
    assert np.array_equal(padded[0, 128], run(model, wide[:, 127:])[0, 1])
