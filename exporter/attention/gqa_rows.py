"""GroupQueryAttention over at least two query rows: what makes the in-place graph exact at level 4.

onnxruntime 1.32's CPU GroupQueryAttention computes a one-token pass (sequence length 1) on another
path than a many-token one, and the two differ in the last bits; int8 activations (MatMulNBits at
accuracy level 4) turn those bits into different greedy ids, so chain windows stopped being
bitwise one-token passes and level-4 artifacts had to run the portable graph. Measured on the
SmolLM2 GGUF artifact: every row of a 2-16 token window *is* bitwise equal to row 0 of a two-token
pass. So each attention node gets one extra query row:

    q, k, v  [B, S, .]  -> Pad one zero row at the end          [B, S+1, .]   (q|k|v when packed)
    position_ids [B, S] -> Pad one 0 at the end                 [B, S+1]      (when it rotates itself)
    seqlens_k + 1, total_sequence_length + 1, query_seqlens + 1, attention_bias padded to [B, 1, S+1, T+1]
    output   [B, S+1, H*D] -> Slice off the last row             [B, S, H*D]

The extra row's key and value are written at length + S, one entry past the window: the kernel's
own causal mask hides it from the real rows (query i sees keys up to length + i), and the next
pass overwrites it. The manifest says so (`check.weights.attention_extra_row`) and the runtime
gives such a cache one spare entry. Added by the weight pass at accuracy level 4 (quantize.py).

The price (SmolLM2 GGUF, one thread, CPU ms, W=1, against the portable graph): 10.1 vs 10.6 at
past 0, 12.0 vs 12.0 at 256, 20.1 vs 17.0 at 1024. The extra row takes the kernel's many-row path,
whose cost grows with the past, so `OrtBackend`'s `auto` keeps level-4 artifacts on the portable
graph; this makes the in-place graph, which the batch engine needs, exact for them.
"""

from __future__ import annotations

import numpy as np

MS_DOMAIN = "com.microsoft"
# GroupQueryAttention's input positions (onnxruntime contrib op, 1.32)
QUERY, KEY, VALUE, SEQLENS_K, TOTAL, POSITIONS, BIAS, QUERY_SEQLENS = 0, 1, 2, 5, 6, 9, 10, 16


def pad_attention_rows(model) -> int:
    """Give every GroupQueryAttention node one extra (zero) query row; returns how many were rewritten."""
    from onnx import helper, numpy_helper

    graph = model.graph
    taken = (
        {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer} | {i.name for i in graph.input}
    )
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
    rewritten = 0

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
        return 0
    nodes = []
    for index, node in enumerate(graph.node):
        nodes += before.get(index, []) + [node] + after.get(index, [])
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(constants.values())
    return rewritten
