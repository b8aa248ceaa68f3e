"""GroupQueryAttention given what it can do itself: the rotary, and q/k/v as one packed input.

After rotary.py and gqa_layout.py a layer's attention is

    MatMul(x, Wq) -> RotaryEmbedding -> GroupQueryAttention.query
    MatMul(x, Wk) -> RotaryEmbedding -> GroupQueryAttention.key
    MatMul(x, Wv) ---------------------> GroupQueryAttention.value

GroupQueryAttention (onnxruntime 1.32) rotates q and k itself (`do_rotary`, the same cos/sin
tables) at explicit `position_ids` [B, W] when given them, so tree windows keep their own positions,
and takes q|k|v concatenated on the last axis as `query` alone. So it becomes

    MatMul(x, Concat(Wq, Wk, Wv)) -> GroupQueryAttention(do_rotary=1, cos, sin, position_ids)

(two RotaryEmbedding and two MatMul nodes fewer a layer; onnxruntime folds the Concat of initializers
when it loads the graph). The three weights stay initializers of their own, so the weight pass
(quantize.py) still finds each by name and writes one MatMulNBits for the Concat. Biased
projections (Qwen2) get `Add(.., Concat(bq, bk, bv))`; q/k/v that are already the three parts of one
Split (GPT-2's c_attn, the weight pass's siblings) pass the Split's input. Anything else (Qwen3's
q/k norms between projection and rotary) keeps separate inputs, and rotary is moved in only where
both q and k come from RotaryEmbedding nodes over the same tables and positions.

Exact: logits and written cache bitwise equal to the unpacked graph (the kernel's rotary is the
RotaryEmbedding op's code; each output column of a MatMul is computed as alone), checked on every
tiny family by the in-place export's check against PyTorch and `tests/exporter/test_gqa_packed.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import helper

from ..graph.rotary import MS_DOMAIN, GraphIndex, attribute, drop_unread_initializers, live_nodes

# GroupQueryAttention's input slots (onnxruntime contrib op, 1.32; gqa.py lists them all)
QUERY, KEY, VALUE, COS, SIN, POSITIONS = 0, 1, 2, 7, 8, 9


@dataclass
class PackReport:
    rotary: int = 0  # attention nodes that now rotate q and k themselves
    packed: int = 0  # attention nodes fed one packed q|k|v


def pack_attention(model) -> PackReport:
    """Rewrite every GroupQueryAttention of `model` (in place) as above."""
    graph = model.graph
    g = GraphIndex(graph)
    report = PackReport()
    removed, added = set(), {}  # added: index of the node to insert before -> new nodes
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != MS_DOMAIN:
            continue
        inputs = list(node.input) + [""] * (POSITIONS + 1 - len(node.input))
        if attribute(node, "do_rotary", 0) == 0 and _rotary_in(inputs, g, removed):
            _set_attribute(node, "do_rotary", 1)
            report.rotary += 1
        packed = _packed(inputs[QUERY : VALUE + 1], g, removed, added)
        if packed is not None:
            inputs[QUERY : VALUE + 1] = [packed, "", ""]
            report.packed += 1
        while inputs and not inputs[-1]:
            inputs.pop()
        del node.input[:]
        node.input.extend(inputs)
    if not (report.rotary or report.packed):
        return report
    nodes = []
    for node in graph.node:
        nodes += added.get(id(node), [])
        if id(node) not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, g.outputs))
    drop_unread_initializers(graph, g)
    return report


def _rotary_in(inputs: list, g: GraphIndex, removed: set) -> bool:
    """Take q's and k's RotaryEmbedding into the attention's inputs when they share tables and positions."""
    rotations = [g.producer.get(inputs[QUERY]), g.producer.get(inputs[KEY])]
    if any(
        r is None
        or r.op_type != "RotaryEmbedding"
        or r.domain != MS_DOMAIN
        or len(g.consumers[r.output[0]]) != 1
        or attribute(r, "interleaved", 0) != 0
        or attribute(r, "rotary_embedding_dim", 0) != 0
        for r in rotations
    ):
        return False
    q, k = rotations
    if list(q.input[1:4]) != list(k.input[1:4]) or attribute(q, "num_heads", 0) == 0:  # 3-D inputs (gqa_layout.py)
        return False
    inputs[QUERY], inputs[KEY] = q.input[0], k.input[0]
    inputs[POSITIONS], inputs[COS], inputs[SIN] = q.input[1], q.input[2], q.input[3]
    removed.update({id(q), id(k)})
    return True


def _packed(parts: list[str], g: GraphIndex, removed: set, added: dict) -> str | None:
    """One tensor holding q|k|v on the last axis, made from their producers; None if they do not allow it."""
    producers = [g.producer.get(p) for p in parts]
    if any(p is None or len(g.consumers[name]) != 1 for p, name in zip(producers, parts)):
        return None
    split = producers[0]
    if (
        split.op_type == "Split"
        and all(p is split for p in producers)
        and list(split.output) == parts
        and attribute(split, "axis", 0) in (-1, len(g.dims(split.input[0]) or []) - 1)
    ):
        removed.add(id(split))
        return split.input[0]
    biases = []
    if all(p.op_type == "Add" for p in producers):  # MatMul + bias
        found = [_bias_of(p, g) for p in producers]
        if any(f is None for f in found):
            return None
        biases = [b for _, b in found]
        matmuls = [g.producer.get(m) for m, _ in found]
        if any(m is None or len(g.consumers[m.output[0]]) != 1 for m in matmuls):
            return None
    else:
        matmuls = producers
    if (
        any(m.op_type != "MatMul" or m.input[1] not in g.constants or m.input[1] in g.producer for m in matmuls)
        or len({m.input[0] for m in matmuls}) != 1
        or any(len(g.constants[m.input[1]].dims) != 2 for m in matmuls)
    ):
        return None
    first = matmuls[0]
    weight, packed = first.input[1] + "_qkv", first.output[0] + "_qkv"
    new = [
        helper.make_node("Concat", [m.input[1] for m in matmuls], [weight], name=first.name + "_qkv_weight", axis=1),
        helper.make_node("MatMul", [first.input[0], weight], [packed], name=first.name + "_qkv"),
    ]
    if biases:
        bias, summed = first.input[1] + "_qkv_bias", packed + "_biased"
        new += [
            helper.make_node("Concat", biases, [bias], name=first.name + "_qkv_bias", axis=0),
            helper.make_node("Add", [packed, bias], [summed], name=first.name + "_qkv_add"),
        ]
        packed = summed
    removed.update(id(n) for n in matmuls + (producers if biases else []))
    added.setdefault(id(first), []).extend(new)
    return packed


def _bias_of(add, g: GraphIndex) -> tuple[str, str] | None:
    """(the MatMul output, the 1-D bias initializer) of `Add(matmul, bias)` in either order."""
    left, right = add.input
    for a, b in ((left, right), (right, left)):
        tensor = g.constants.get(b)
        if tensor is not None and b not in g.producer and len(tensor.dims) == 1 and a in g.producer:
            return a, b
    return None


def _set_attribute(node, name: str, value: int) -> None:
    for a in node.attribute:
        if a.name == name:
            a.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))
