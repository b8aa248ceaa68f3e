"""The in-place graph's q/k/v handed to GroupQueryAttention in the [B, W, heads * D] layout it reads.

The model's attention reshapes each projection to [B, W, heads, D] and transposes it to
[B, heads, W, D]; `jacobi::gqa` (gqa.py) takes [B, W, heads * D], so the traced graph transposes
and reshapes back, and the attention output goes [B, W, H * D] -> [B, W, H, D] -> [B, W, H * D]
before o_proj. onnxruntime pushed those transposes through the traced rotary's elementwise ops,
but not through `RotaryEmbedding` (rotary.py), which takes the 3-D layout as well. So, after the
rotary rewrite:

    MatMul -> Reshape -> Transpose -> RotaryEmbedding -> Transpose -> Reshape    becomes
    MatMul -> RotaryEmbedding(num_heads)                                          (q and k)
    Reshape(Reshape(a)) back to a's own shape                                     becomes  a   (v, the output)

Exact: the same values in the same memory order, only the node count changes.
"""

from __future__ import annotations

from onnx import helper

from ..graph.rotary import MS_DOMAIN, GraphIndex, drop_unread_initializers, live_nodes

PERM = [0, 2, 1, 3]


def feed_gqa_3d(model) -> int:
    """Rewrite `model` (in place) as above; return how many nodes went."""
    graph = model.graph
    before = len(graph.node)
    g = GraphIndex(graph)
    replaced, removed, renamed = {}, set(), {}
    for node in graph.node:
        if node.op_type == "RotaryEmbedding" and node.domain == MS_DOMAIN:
            _rotary_3d(node, g, replaced, removed)
    for node in graph.node:
        if node.op_type == "Reshape" and id(node) not in removed and id(node) not in replaced:
            _round_trip(node, g, removed, renamed)
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in removed]
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, g.outputs))  # the shapes only the removed Reshapes read
    drop_unread_initializers(graph, g)
    return before - len(graph.node)


def _rotary_3d(rotary, g: GraphIndex, replaced: dict, removed: set) -> None:
    into = g.producer.get(rotary.input[0])
    out = g.only_user(rotary.output[0], "Transpose")
    flat = g.only_user(out.output[0], "Reshape") if out is not None else None
    if into is None or into.op_type != "Transpose" or len(g.consumers[into.output[0]]) != 1 or flat is None:
        return
    if _perm(into) != PERM or _perm(out) != PERM:
        return
    heads = g.dims(rotary.input[0])
    flat_dims = g.dims(flat.output[0])
    if not heads or len(heads) != 4 or not isinstance(heads[1], int) or not flat_dims or len(flat_dims) != 3:
        return
    source = g.producer.get(into.input[0])  # Reshape([B, W, H*D] -> [B, W, H, D]) when the model did nothing between
    if (
        source is None
        or source.op_type != "Reshape"
        or len(g.consumers[source.output[0]]) != 1
        or not _same(g.dims(source.input[0]), flat_dims)
    ):
        return
    removed.update({id(source), id(into), id(out), id(flat)})
    replaced[id(rotary)] = helper.make_node(
        "RotaryEmbedding",
        [source.input[0], *rotary.input[1:]],
        [flat.output[0]],
        name=rotary.name + "_3d",
        domain=MS_DOMAIN,
        interleaved=0,
        num_heads=heads[1],
    )


def _round_trip(second, g: GraphIndex, removed: set, renamed: dict) -> None:
    first = g.producer.get(second.input[0])
    if first is None or first.op_type != "Reshape" or id(first) in removed or len(g.consumers[first.output[0]]) != 1:
        return
    if second.output[0] in g.outputs or not _same(g.dims(first.input[0]), g.dims(second.output[0])):
        return
    removed.update({id(first), id(second)})
    renamed[second.output[0]] = renamed.get(first.input[0], first.input[0])


def _perm(node) -> list | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _same(a: list | None, b: list | None) -> bool:
    """Shapes known to be equal: same rank, every dimension a known number or the same symbol."""
    return bool(a) and a == b and all(d not in ("", 0) for d in a)
