"""--weights gguf: a GGUF file's own quantized blocks in the graph, bit for bit.

Tiny Llama GGUF files (tiny_gguf.py) in Q4_0, Q4_1 and Q8_0 are exported with their blocks kept;
the test reads the blocks back out of the ONNX with its own decoding (not the exporter's) and
compares them with what the `gguf` package dequantizes, then compares the graph's outputs with
the float export of the same file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_helpers import hf_case, run
from onnx import numpy_helper

gguf = pytest.importorskip("gguf", reason="GGUF sources need the `gguf` package: pip install 'jacobi-rt[export]'")

from tiny_gguf import write_tiny_gguf  # noqa: E402

TYPES = ["Q4_0", "Q4_1", "Q8_0"]  # Q5_0/Q5_1 and the K-quants: test_export_gguf_kquants.py


@dataclass
class GgufExport:
    qtype: str
    gguf_file: Path
    folder: Path  # --weights gguf, accuracy level 0
    manifest: object
    float_folder: Path  # the same file, dequantized (--weights float)


@pytest.fixture(scope="module", params=TYPES)
def exported(request, tmp_path_factory) -> GgufExport:
    from jacobi_rt.exporter import ExportOptions, export

    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    path = write_tiny_gguf(root / f"tiny-{request.param}.gguf", request.param, tied=request.param == "Q8_0")
    manifest = export(str(path), root / "gguf", ExportOptions(weights="gguf", accuracy_level=0))
    export(str(path), root / "float", ExportOptions(inplace=False))
    return GgufExport(request.param, path, root / "gguf", manifest, root / "float")


def read_blocks(graph) -> list[tuple[str, np.ndarray]]:
    """(op, W [N, K] float32) for every MatMulNBits and GatherBlockQuantized, decoded here from the
    stored bytes: 4 bits low nibble first, zero point 2**(bits-1), plus the offset matrix that an
    Add after MatMul(blocksum(x), C) contributes (see is_blocksum); a MatMulNBits of
    siblings (q/k/v) gives one W per output of the Split that follows it."""
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    out = []
    for node in graph.node:
        if node.op_type not in ("MatMulNBits", "GatherBlockQuantized"):
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        bits, block = attrs["bits"], attrs["block_size"]
        assert len(node.input) == 3, "a zero-point input: the slow kernel path"
        data = node.input[0] if node.op_type == "GatherBlockQuantized" else node.input[1]
        raw = inits[data] if data in inits else inits[producer[data].input[0]]  # Gather reads through a Reshape
        scales = inits[node.input[2]].astype(np.float64)
        n = scales.shape[0]
        raw = raw.reshape(n, -1)
        q = raw if bits == 8 else np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(n, -1)
        w = (q.reshape(n, -1, block).astype(np.float64) - (1 << (bits - 1))) * scales[..., None]
        users, tail = consumers.get(node.output[0], []), node.output[0]
        columns = block_sum_columns(node, users, inits, consumers, producer, block)
        if columns is not None:  # the block sums are the last K/block output columns (quantize.with_block_sums)
            sums, offsets, tail = columns
            n -= sums
            assert is_indicator(q.reshape(n + sums, -1)[n:], scales[n:], block, 1 << (bits - 1))
            w = w[:n] + offsets.T.astype(np.float64)[..., None]
        elif (
            node.op_type == "GatherBlockQuantized"
            and (offsets := gathered_offsets(node, users, inits, consumers, producer)) is not None
        ):
            w = w + offsets.astype(np.float64)[..., None]  # each row's block offsets, added per block
        elif node.op_type == "MatMulNBits" and len(users) == 1 and users[0].op_type == "Add":
            other = producer.get([x for x in users[0].input if x != node.output[0]][0])
            sums = producer.get(other.input[0]) if other is not None and other.op_type == "MatMul" else None
            if is_blocksum(sums, node.input[0], block, inits, producer):
                offsets = inits[other.input[1]].T.astype(np.float64)  # MatMul(blocksum, C^T)
                w = w + offsets[..., None]
                tail = users[0].output[0]
        w = w.reshape(n, -1).astype(np.float32)
        users = consumers.get(tail, [])
        if node.op_type == "MatMulNBits" and len(users) == 1 and users[0].op_type == "Split":
            sizes = inits[users[0].input[1]]
            assert sizes.sum() == n and len(sizes) == len(users[0].output)
            out += [(node.op_type, part) for part in np.split(w, np.cumsum(sizes)[:-1])]
        elif node.op_type == "MatMulNBits" and (attention := packed_attention(tail, consumers)) is not None:
            heads = {a.name: a.i for a in attention.attribute}
            width = n // (heads["num_heads"] + 2 * heads["kv_num_heads"])  # q | k | v (gqa_packed.py)
            out += [
                (node.op_type, part)
                for part in np.split(
                    w, [heads["num_heads"] * width, (heads["num_heads"] + heads["kv_num_heads"]) * width]
                )
            ]
        else:
            out.append((node.op_type, w))
    return out


def gathered_offsets(node, users, inits, consumers, producer):
    """The offset table [V, K/block] when the gathered rows are Reshaped to blocks and an Add brings
    Unsqueeze(Gather(table, the same ids)); else None."""
    if len(users) != 1 or users[0].op_type != "Reshape":
        return None
    adds = consumers.get(users[0].output[0], [])
    if len(adds) != 1 or adds[0].op_type != "Add":
        return None
    spread = producer.get([x for x in adds[0].input if x != users[0].output[0]][0])
    gather = producer.get(spread.input[0]) if spread is not None and spread.op_type == "Unsqueeze" else None
    if gather is None or gather.op_type != "Gather" or gather.input[1] != node.input[1] or gather.input[0] not in inits:
        return None
    return inits[gather.input[0]]


def packed_attention(name: str, consumers: dict):
    """The GroupQueryAttention that reads `name` as its packed q|k|v (through level 4's Pad), or None."""
    users = consumers.get(name, [])
    if len(users) == 1 and users[0].op_type == "Pad":
        name, users = users[0].output[0], consumers.get(users[0].output[0], [])
    if (
        len(users) == 1
        and users[0].op_type == "GroupQueryAttention"
        and users[0].input[0] == name
        and not users[0].input[1]
    ):
        return users[0]
    return None


def block_sum_columns(node, users, inits, consumers, producer, block):
    """(K/block, C, the Add's output) when the node's output is Split into (main, block sums) and
    main + MatMul(sums, C) follows; else None."""
    if node.op_type != "MatMulNBits" or len(users) != 1 or users[0].op_type != "Split" or len(users[0].output) != 2:
        return None
    main, sums = users[0].output
    after = consumers.get(sums, [])
    if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[1] not in inits:
        return None
    add = consumers.get(main, [])
    if len(add) != 1 or add[0].op_type != "Add" or set(add[0].input) != {main, after[0].output[0]}:
        return None
    return int(inits[users[0].input[1]][1]), inits[after[0].input[1]], add[0].output[0]


def is_indicator(q: np.ndarray, scales: np.ndarray, block: int, zero: int) -> bool:
    """Rows that sum x over one block each: scale 1, q = zero + 1 inside block j, zero outside."""
    expected = np.full((len(q), q.shape[1] // block, block), zero)
    expected[np.arange(len(q)), np.arange(len(q))] = zero + 1
    return bool(np.all(scales == 1.0)) and np.array_equal(q, expected.reshape(len(q), -1))


def is_blocksum(node, x: str, block: int, inits: dict, producer: dict) -> bool:
    """node sums x over each block: ReduceSum(Reshape(x, [.., K/block, block]), -1) or x @ E (E: 0/1)."""
    if node is None:
        return False
    if node.op_type == "MatMul" and node.input[1] in inits:
        return node.input[0] == x and set(np.unique(inits[node.input[1]])) <= {0.0, 1.0}
    reshape = producer.get(node.input[0])
    return (
        node.op_type == "ReduceSum"
        and list(inits[node.input[1]]) == [-1]
        and reshape is not None
        and reshape.op_type == "Reshape"
        and reshape.input[0] == x
        and inits[reshape.input[1]][-1] == block
    )


def gguf_dequantized(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    return {
        t.name: (t.tensor_type.name, dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0])))
        for t in reader.tensors
        if len(t.shape) == 2
    }


def sorted_rows(w: np.ndarray) -> np.ndarray:
    """Rows in a canonical order (by their bytes): transformers' loader permutes q/k rows."""
    bits = np.ascontiguousarray(w).view(np.uint32)
    return bits[np.lexsort(bits.T[::-1])]


def test_blocks_equal_what_gguf_dequantizes(exported):
    tensors = gguf_dequantized(exported.gguf_file)
    for graph_file in dict.fromkeys(exported.manifest.graphs.values()):
        found = read_blocks(onnx.load(str(exported.folder / graph_file)).graph)
        assert len([op for op, _ in found if op == "MatMulNBits"]) == 2 * 7 + 1  # 7 per layer + the LM head
        for op, w in found:
            same = [
                name
                for name, (_, g) in tensors.items()
                if g.shape == w.shape and np.array_equal(sorted_rows(g), sorted_rows(w))
            ]
            assert same, f"a {op} of {graph_file} is no GGUF tensor, bit for bit"
        assert any(op == "GatherBlockQuantized" for op, _ in found)  # a Q4_1 table too, plus its rows' offsets


def test_blocks_equal_the_float_export(exported):
    """The traced float initializers are transformers' dequantization: the blocks reproduce them."""
    float_graph = onnx.load(str(exported.float_folder / "model.onnx")).graph
    inits = {i.name: numpy_helper.to_array(i) for i in float_graph.initializer}
    float_weights = [inits[n.input[1]].T for n in float_graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    quantized = [
        w for op, w in read_blocks(onnx.load(str(exported.folder / "model.onnx")).graph) if op == "MatMulNBits"
    ]
    tied = exported.qtype == "Q8_0"  # the tied LM head reads the table through a Transpose in the float graph
    assert len(float_weights) == len(quantized) - tied
    for f, q in zip(float_weights, quantized):
        assert np.array_equal(f.view(np.uint32), q.view(np.uint32))


def test_outputs_match_the_float_export(exported, ort_session):
    from jacobi_rt.exporter import sources

    model, _ = sources.load(sources.resolve(str(exported.gguf_file)))
    q_session, f_session = ort_session(exported.folder), ort_session(exported.float_folder)
    for batch, window, past in [(1, 1, 0), (1, 8, 17), (2, 5, 6)]:
        case = hf_case(model, batch, window, past, seed=window + past)
        q, f = run(q_session, case.feeds), run(f_session, case.feeds)
        assert np.abs(q["logits"] - f["logits"]).max() < 1e-3  # accuracy level 0: float activations
        assert np.array_equal(q["greedy_ids"], f["greedy_ids"])


def test_siblings_compute_each_output_as_alone(exported, tmp_path):
    """q/k/v and gate/up share one MatMulNBits (and, for Q4_1, one offset MatMul and Add) and a
    Split: at accuracy level 4 the logits are bitwise those of one node per matrix."""
    import onnxruntime as ort

    from jacobi_rt.exporter import sources
    from jacobi_rt.exporter.weights.gguf_weights import GgufWeights
    from jacobi_rt.exporter.weights.quantize import quantize_graph_file

    planner = GgufWeights(exported.gguf_file).plan
    sessions = {}
    for siblings in (True, False):
        path = tmp_path / f"siblings-{siblings}.onnx"
        quantize_graph_file(exported.float_folder / "model.onnx", path, planner, 4, siblings)
        nbits = sum(n.op_type == "MatMulNBits" for n in onnx.load(str(path)).graph.node)
        assert nbits == (2 * 4 if siblings else 2 * 7) + 1  # per layer qkv, o, gate/up, down (or 7); the LM head
        sessions[siblings] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model, _ = sources.load(sources.resolve(str(exported.gguf_file)))
    for batch, window, past in [(1, 1, 0), (1, 8, 17), (2, 5, 6)]:
        feeds = hf_case(model, batch, window, past, seed=window + past).feeds
        joined, alone = run(sessions[True], feeds), run(sessions[False], feeds)
        assert all(np.array_equal(joined[name], alone[name]) for name in alone)


def test_manifest_records_the_weights(exported):
    manifest = exported.manifest
    weights = manifest.check["weights"]
    assert manifest.quantization == "gguf" and weights["kind"] == "gguf" and weights["exact"]
    assert weights["accuracy_level"] == 0
    # 14 layer weights, the LM head, the embedding table (tied or not)
    assert weights["tensor_types"] == {exported.qtype: 16}
    assert weights["kept_float"] == {}
    figures = manifest.check["gguf_vs_fp"]
    assert figures["agreement"] == 1.0 and figures["max_logit_diff"] < 1e-3


def weight_bytes(graph_file: Path) -> int:
    """Bytes of the stored matrices (the graph's other constants are the same in both exports, but for
    the quantized graph's rotary cos/sin tables: exporter/graph/rotary.py)."""
    return sum(
        len(i.raw_data)
        for i in onnx.load(str(graph_file)).graph.initializer
        if len(i.dims) >= 2 and not i.name.startswith("rotary_")
    )


def test_gguf_weights_are_smaller(exported):
    quantized, floats = weight_bytes(exported.folder / "model.onnx"), weight_bytes(exported.float_folder / "model.onnx")
    # 4 bits + fp32 scale (+ fp32 offset) or 8 bits + scale per weight, against 32 bits
    limit = {"Q4_0": 0.2, "Q4_1": 0.25, "Q8_0": 0.32}[exported.qtype]
    assert quantized < limit * floats, (quantized, floats)


def test_default_accuracy_level_is_4(artifact):
    """The tiny Llama's Q4_1 GGUF exported with the default options (tests/make_artifacts.py's TINY_GGUF,
    CI's prebuilt artifact): its MatMulNBits run at accuracy level 4."""
    from make_artifacts import TINY_GGUF

    from jacobi_rt.runtime.manifest import load_manifest

    folder = artifact(TINY_GGUF)
    manifest = load_manifest(folder)
    graph = onnx.load(str(folder / "model.onnx")).graph
    levels = {
        onnx.helper.get_attribute_value(a)
        for n in graph.node
        if n.op_type == "MatMulNBits"
        for a in n.attribute
        if a.name == "accuracy_level"
    }
    assert levels == {4} and manifest.check["weights"]["accuracy_level"] == 4
    assert 0.5 <= manifest.check["gguf_vs_fp"]["agreement"] <= 1  # int8 activations: close, not exact


def test_unsupported_type_stays_float_and_is_named(tmp_path):
    from jacobi_rt.exporter import ExportOptions, export

    path = write_tiny_gguf(tmp_path / "mixed.gguf", "Q4_0", overrides={"blk.0.ffn_down.weight": "IQ4_NL"})
    lines = []
    manifest = export(str(path), tmp_path / "art", ExportOptions(weights="gguf", inplace=False), step=lines.append)
    assert any("IQ4_NL" in line and "blk.0.ffn_down.weight" in line for line in lines), lines
    weights = manifest.check["weights"]
    assert weights["kept_float"] == {"IQ4_NL": 1}
    graph = onnx.load(str(tmp_path / "art" / "model.onnx")).graph
    stored = {i.name for i in graph.initializer}
    assert (
        len([n for n in graph.node if n.op_type == "MatMul" and n.input[1] in stored]) == 1
    )  # Q4_0 has no offset MatMuls
    assert weights["tensor_types"] == {"Q4_0": 15}  # 16 weights, one of them Q5_0


def test_gguf_weights_need_a_gguf_source(tiny_model, tmp_path):
    from jacobi_rt.exporter import ExportOptions, export
    from jacobi_rt.runtime.errors import OptionError

    with pytest.raises(OptionError, match="`weights` gguf") as info:
        export(str(tiny_model("llama")), tmp_path / "art", ExportOptions(weights="gguf"))
    assert "`quantize`" in str(info.value)
    assert not (tmp_path / "art").exists()
