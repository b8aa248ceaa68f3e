"""GroupQueryAttention over at least two query rows: what makes the in-place graph's windows exact.

onnxruntime 1.32's CPU GroupQueryAttention computes a one-token pass (sequence length 1) on another
path than a many-token one, and the two differ in the last bits; int8 activations (MatMulNBits at
accuracy level 4) turn those bits into different greedy ids, and float32 greedy ids differ where the
top two logits nearly tie. Measured on the SmolLM2 GGUF artifact: every row of a 2-16 token window
*is* bitwise equal to row 0 of a two-token pass. So each attention node gets one extra query row:

    q, k, v  [B, S, .]  -> Pad one zero row at the end          [B, S+1, .]   (q|k|v when packed)
    position_ids [B, S] -> Pad one 0 at the end                 [B, S+1]      (when it rotates itself)
    seqlens_k + 1, total_sequence_length + 1, query_seqlens + 1, attention_bias padded to [B, 1, S+1, T+1]
    output   [B, S+1, H*D] -> Slice off the last row             [B, S, H*D]

The extra row's key and value are written at length + S, one entry past the window: the kernel's
own causal mask hides it from the real rows (query i sees keys up to length + i), and the next
pass overwrites it. The manifest says so (`Manifest.attention_extra_row`) and the runtime gives
such a cache one spare entry.

Which graphs get it (`wanted`): float weights (MatMul) and MatMulNBits at level 4, whose matmuls have
no one-row kernel of their own, so a one-token pass with the row is exact as it comes; without it,
the load-time check (runtime/backends/exact_rows.py) pads every one-token pass to two tokens, matmuls
included. Level 0 keeps SQ4BitGemmM1Kernel for one row, so it is padded whole either way. The
in-place trace adds it (exporter/graph/inplace.py, covered by the in-place check); the weight pass
adds it to a `graphs_from` source that lacks it (quantize.py) and leaves a source's row in a level-0
variant (exact there too, at the Pad and Slice's cost).

The price: two nodes a layer (Pad, Slice; 0.4 ms of a 13 ms int4 pass) and the kernel's many-row
path, whose cost grows with the past (SmolLM2 GGUF, one thread, W=1, against the portable graph: 10.1
vs 10.6 ms at past 0, 20.1 vs 17.0 at 1024). What it buys on float32 (AMD EPYC): greedy 1.06x
tokens/s, 16 greedy rows side by side 1.25x (docs/bench/2026-12-06-float-extra-row.md).
"""

from __future__ import annotations

import numpy as np

MS_DOMAIN = "com.microsoft"
# GroupQueryAttention's input positions (onnxruntime contrib op, 1.32)
QUERY, KEY, VALUE, SEQLENS_K, TOTAL, POSITIONS, BIAS, QUERY_SEQLENS = 0, 1, 2, 5, 6, 9, 10, 16


def wanted(accuracy_level: int | None) -> bool:
    """Whether an in-place graph with weights at `accuracy_level` (None: float MatMul) gets the extra row."""
    return accuracy_level in (None, 4)


def pad_attention_rows(model) -> int:
    """Give every GroupQueryAttention node one extra (zero) query row, once: a node that has it (its query
    padded) is left as it is. Returns how many nodes have the row."""
    from onnx import helper, numpy_helper

    graph = model.graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    taken = set(producer) | {i.name for i in graph.initializer} | {i.name for i in graph.input}
    counter = [0]

    def name(base: str) -> str:
        while True:
            counter[0] += 1
            candidate = f"{base}_rows{counter[0]}"
            if candidate not in taken:
                taken.add(candidate)
                return candidate

    constants = {
        "one32": numpy_helper.from_array(np.array(1, np.int32), name("one_int32")),
        "row": numpy_helper.from_array(
            np.array([0, 0, 0, 0, 1, 0], np.int64), name("pad_row")
        ),  # [B, S, .]: one row at the end
        "positions": numpy_helper.from_array(np.array([0, 0, 0, 1], np.int64), name("pad_positions")),  # [B, S]
        "bias": numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), name("pad_bias")),
        "start": numpy_helper.from_array(np.array([0], np.int64), name("slice_start")),
        "end": numpy_helper.from_array(np.array([-1], np.int64), name("slice_end")),
        "axis": numpy_helper.from_array(np.array([1], np.int64), name("slice_axis")),
    }
    shared: dict[tuple[str, str], str] = {}  # (kind, input) -> its padded / incremented form, made once
    before: dict[int, list] = {}  # node index -> nodes to insert ahead of it
    after: dict[int, list] = {}
    rewritten = padded_before = 0

    def once(kind: str, source: str, index: int, make) -> str:
        key = (kind, source)
        if key not in shared:
            shared[key] = name(source)
            before.setdefault(index, []).append(make(source, shared[key]))
        return shared[key]

    def plus_one(source, out):
        return helper.make_node("Add", [source, constants["one32"].name], [out])

    def pad(kind: str):
        return lambda source, out: helper.make_node("Pad", [source, constants[kind].name], [out], mode="constant")

    for index, node in enumerate(graph.node):
        if node.op_type != "GroupQueryAttention" or node.domain != MS_DOMAIN:
            continue
        if producer.get(node.input[QUERY]) == "Pad":
            padded_before += 1
            continue
        inputs = list(node.input) + [""] * (QUERY_SEQLENS + 1 - len(node.input))
        # key and value are empty when q|k|v come packed (gqa_packed.py); positions are there when it rotates
        # itself, and the extra row's position is 0, a row of the tables
        for slot, kind in ((QUERY, "row"), (KEY, "row"), (VALUE, "row"), (POSITIONS, "positions"), (BIAS, "bias")):
            if inputs[slot]:
                inputs[slot] = once(kind, inputs[slot], index, pad(kind))
        for slot in (SEQLENS_K, TOTAL, QUERY_SEQLENS):
            if inputs[slot]:
                inputs[slot] = once("plus", inputs[slot], index, plus_one)
        output = node.output[0]
        padded = name(output)
        del node.input[:]
        node.input.extend(inputs)
        node.output[0] = padded
        after.setdefault(index, []).append(
            helper.make_node(
                "Slice", [padded, constants["start"].name, constants["end"].name, constants["axis"].name], [output]
            )
        )
        rewritten += 1
    if not rewritten:
        return padded_before
    nodes = []
    for index, node in enumerate(graph.node):
        nodes += before.get(index, []) + [node] + after.get(index, [])
    del graph.node[:]
    graph.node.extend(nodes)
    read = {name for node in nodes for name in node.input}  # a constant no node reads would warn at every load
    graph.initializer.extend(c for c in constants.values() if c.name in read)
    return padded_before + rewritten
