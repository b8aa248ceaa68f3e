"""--weights gguf on K-quants (Q2_K to Q6_K) and Q5_0/Q5_1: the blocks decoded bit for bit as the
`gguf` package dequantizes them, and a Q4_K_M-like file (types mixed within a layer) exported whole.

K-quants pack 256 values a block, so the end-to-end file is tiny_gguf's wide Llama (hidden 256,
FFN 512) with random well-formed blocks (the gguf package cannot quantize to K-quants).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

gguf = pytest.importorskip("gguf", reason="GGUF sources need the `gguf` package: pip install 'jacobi-rt[export]'")

from test_export_gguf import gguf_dequantized, read_blocks  # noqa: E402
from tiny_gguf import k_quant_blocks, write_tiny_gguf  # noqa: E402


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_blocks_decode_bit_for_bit_as_gguf_dequantizes(kind):
    from gguf.quants import dequantize

    from jacobi_rt.exporter.weights.blocks import from_gguf

    raw = k_quant_blocks(kind, 6, 512, np.random.default_rng(7))
    want = dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(6, 512).astype(np.float32)
    blocks = from_gguf(kind, raw, 6, 512)
    assert (blocks.bits, blocks.block) == {
        "Q2_K": (4, 16),
        "Q3_K": (4, 16),
        "Q4_K": (4, 32),
        "Q5_K": (8, 32),
        "Q6_K": (8, 16),
    }[kind]
    assert np.array_equal(blocks.dequantize().view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1"])
def test_five_bit_blocks_decode_bit_for_bit_as_gguf_dequantizes(kind):
    """What llama.cpp's Q4_K_M recipe falls back to where a row is not a multiple of 256 (SmolLM2's 576)."""
    from gguf.quants import dequantize, quantize

    from jacobi_rt.exporter.weights.blocks import from_gguf

    ggml = gguf.GGMLQuantizationType[kind]
    raw = quantize(np.random.default_rng(3).standard_normal((5, 576)).astype(np.float32), ggml)
    want = dequantize(raw, ggml).reshape(5, 576).astype(np.float32)
    blocks = from_gguf(kind, raw, 5, 576)
    assert (blocks.bits, blocks.offsets is None) == (8, kind == "Q5_0")
    assert np.array_equal(blocks.dequantize().view(np.uint32), want.view(np.uint32))


def test_an_offset_float32_cannot_hold_takes_8_bits_and_stays_exact():
    """Q4_K's 4-bit form adds m + 8*scale per block; when that sum needs more than float32's 24 bits
    (here scale 63*(1 + 2**-10), min 2**-14*(1 + 2**-10)), the tensor takes 8 bits with offset m."""
    from gguf.quants import dequantize

    from jacobi_rt.exporter.weights.blocks import from_gguf

    raw = k_quant_blocks("Q4_K", 1, 256, np.random.default_rng(0))
    raw[0, 0:2] = np.array([1 + 2**-10], np.float16).view(np.uint8)  # d
    raw[0, 2:4] = np.array([2**-14 * (1 + 2**-10)], np.float16).view(np.uint8)  # dmin
    raw[0, 4:16] = 0
    raw[0, 4], raw[0, 8] = 63, 1  # sub-block 0: scale 63, min 1
    want = dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(1, 256).astype(np.float32)
    blocks = from_gguf("Q4_K", raw, 1, 256)
    assert blocks.bits == 8
    assert np.array_equal(blocks.dequantize().view(np.uint32), want.view(np.uint32))


# Q4_K_M's mix: Q4_K by default, Q6_K for v, the LM head and half the down projections; one each of
# Q5_K, Q3_K (4 bits in blocks of 16) and Q2_K (4 bits with offsets in blocks of 16)
MIX = {
    "blk.0.attn_v.weight": "Q6_K",
    "blk.1.attn_v.weight": "Q6_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "output.weight": "Q6_K",
    "blk.1.attn_output.weight": "Q5_K",
    "blk.0.attn_output.weight": "Q3_K",
    "blk.1.ffn_down.weight": "Q2_K",
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    from jacobi_rt.exporter import ExportOptions, export

    root = tmp_path_factory.mktemp("gguf-kquants")
    path = write_tiny_gguf(root / "tiny-q4_k_m.gguf", "Q4_K", overrides=MIX, wide=True)
    return path, root / "art", export(str(path), root / "art", ExportOptions(weights="gguf"))


def test_a_q4_k_m_file_keeps_every_block_and_records_its_types(mixed):
    _, _, manifest = mixed
    weights = manifest.check["weights"]
    assert manifest.quantization == "gguf" and weights["exact"] and weights["accuracy_level"] == 4
    # 14 layer weights, the LM head and the embedding table (a Gather plus its rows' block offsets): none left float
    assert weights["tensor_types"] == {"Q4_K": 9, "Q6_K": 4, "Q5_K": 1, "Q3_K": 1, "Q2_K": 1}
    assert weights["kept_float"] == {}
    assert 0.5 <= manifest.check["gguf_vs_fp"]["agreement"] <= 1  # int8 activations: close, not exact


def test_every_stored_block_is_the_ggufs_bit_for_bit(mixed):
    """The rows of every MatMulNBits (q|k in one node and v, of another type, in the next: a Concat)
    are the rows of the file's tensors, decoded by the tests' own reader."""
    path, folder, manifest = mixed
    tensors = gguf_dequantized(path)
    expected = [w for name, (kind, w) in tensors.items() if name != "token_embd.weight"]  # the table is a Gather
    for graph_file in manifest.graphs.values():
        graph = onnx.load(str(folder / graph_file)).graph
        producer = {o: n for n in graph.node for o in n.output}
        joins = [
            n
            for n in graph.node
            if n.op_type == "Concat"
            and len(n.input) == 2
            and all(producer[i].op_type in ("MatMulNBits", "Add") for i in n.input if i in producer)
        ]
        # the in-place graph reads q|k|v packed: per layer q|k (Q4_K, with its offset Add) and v (Q6_K), joined
        assert len(joins) == (2 if graph_file == manifest.graphs["inplace"] else 0), graph_file
        found = [w for op, w in read_blocks(graph) if op == "MatMulNBits"]
        for k in {w.shape[1] for w in expected}:
            want = np.concatenate([w for w in expected if w.shape[1] == k]).view(np.uint32)
            got = np.concatenate([w for w in found if w.shape[1] == k]).view(np.uint32)
            assert np.array_equal(_sorted(want), _sorted(got)), f"{graph_file}: the rows of K={k}"


def _sorted(rows: np.ndarray) -> np.ndarray:
    return rows[np.lexsort(rows.T[::-1])]


def test_every_strategy_equals_greedy_on_it(mixed):
    from jacobi_rt.runtime import Generator

    _, folder, _ = mixed
    generator = Generator.load(folder, threads=1)
    assert generator.backend.graph == "inplace"  # level 4 with its extra attention row
    prompt = [5, 17, 33, 90, 5, 17, 33, 90]
    greedy = generator.generate(prompt, max_new_tokens=24, strategy="greedy").ids
    for strategy in ("jacobi", "lookahead"):
        assert generator.generate(prompt, max_new_tokens=24, strategy=strategy).ids == greedy, strategy
