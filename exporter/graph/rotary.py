"""Traced rotary embeddings -> `com.microsoft.RotaryEmbedding`, in onnxruntime-only graphs.

Llama-style rotary (`q * cos + rotate_half(q) * sin`, rotate_half = cat(-x2, x1)) traces to seven
nodes per query and per key (Mul, Slice, Slice, Neg, Concat, Mul, Add) that onnxruntime does not
fuse: about 420 nodes on SmolLM2. The contrib op does the same with explicit `position_ids` (tree
windows give each entry its own position) and cos/sin tables of [positions, head_dim / 2]. In the
in-place graph, gqa_packed.py then moves the rotation into GroupQueryAttention itself.

A rewrite of the traced graph, not a custom op in the trace, because the quantized graphs are
made from the traced portable graph by the weight pass: one rewrite serves the in-place graph
(right after its trace, before its PyTorch check) and every quantized graph. The fp32 portable
graph keeps the standard ops (TensorRT).

Detected, not assumed: the cos and sin must be computed from `position_ids` alone; the tables are
that very subgraph evaluated by onnxruntime at every position, and are used only if the result
is a rotate-half table (equal halves), the same per position whatever else the batch holds, and
as wide as the head (a partial rotary leaves the rest of the head unrotated: left alone). Families
without rotary (GPT-2's learned positions) have no such pattern and are left alone too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

MS_DOMAIN = "com.microsoft"
POSITIONS = "position_ids"


@dataclass
class RotaryReport:
    """What `fuse_rotary` did: how many q/k rotations became one node, and why others stayed."""

    fused: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # cos tensor -> why its rotations were left alone


@dataclass
class _Rotation:
    x: str  # the rotated tensor [B, H, S, D]
    cos: str  # [B, S, D] before the heads' Unsqueeze
    sin: str
    nodes: list  # the seven traced nodes; the last one's output is the rotation's


def fuse_rotary(model, max_positions: int) -> RotaryReport:
    """Rewrite every traced rotate-half rotation of `model` (an onnx ModelProto, in place) whose
    tables are exact, as one RotaryEmbedding over `max_positions` positions."""
    from onnx import helper, numpy_helper

    graph = model.graph
    report = RotaryReport()
    if POSITIONS not in {i.name for i in graph.input}:
        return report
    g = GraphIndex(graph)
    by_tables = defaultdict(list)
    for node in graph.node:
        rotation = _rotation_at(node, g) if node.op_type == "Neg" else None
        if rotation is not None:
            by_tables[(rotation.cos, rotation.sin)].append(rotation)
    replaced, removed = {}, set()
    for (cos, sin), rotations in by_tables.items():
        tables = _tables(model, g, cos, sin, max_positions)
        width = {g.last_dim(r.x) for r in rotations}
        if isinstance(tables, str) or width != {2 * tables[0].shape[1]} or width != {g.head_dim}:
            report.skipped[cos] = (
                tables if isinstance(tables, str) else f"rotates {sorted(width)} of a {g.head_dim}-wide head"
            )
            continue
        names = [
            _add(graph, g, numpy_helper.from_array(t, f"rotary_{kind}_cache"))
            for kind, t in zip(("cos", "sin"), tables)
        ]
        for r in rotations:
            last = r.nodes[-1]
            replaced[id(last)] = helper.make_node(
                "RotaryEmbedding",
                [r.x, POSITIONS, *names],
                [last.output[0]],
                name=last.name + "_rotary",
                domain=MS_DOMAIN,
                interleaved=0,
            )
            removed.update(id(n) for n in r.nodes[:-1])
            report.fused += 1
    if not report.fused:
        return report
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in removed]
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, {o.name for o in graph.output}))
    drop_unread_initializers(graph, g)  # what only the traced rotary read
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return report


class GraphIndex:
    """Producers, consumers, constants and static shapes of a graph, for matching."""

    def __init__(self, graph):
        self.constants = {i.name: i for i in graph.initializer}  # TensorProtos, read when matched
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.values = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
        self.shapes = {name: v.type.tensor_type.shape for name, v in self.values.items()}
        self.index = {id(n): i for i, n in enumerate(graph.node)}
        self.outputs = {o.name for o in graph.output}
        pasts = [i for i in graph.input if i.name.startswith("past_key_values.")]
        self.head_dim = self.last_dim(pasts[0].name) if pasts else None

    def dims(self, name: str) -> list | None:
        shape = self.shapes.get(name)
        return None if shape is None else [d.dim_value if d.HasField("dim_value") else d.dim_param for d in shape.dim]

    def last_dim(self, name: str) -> int | None:
        dims = self.dims(name)
        return dims[-1] if dims and isinstance(dims[-1], int) and dims[-1] > 0 else None

    def only_user(self, name: str, op: str):
        users = self.consumers[name]
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def value(self, name: str) -> list | None:
        """A small constant's values (slice bounds, axes), else None."""
        from onnx import numpy_helper

        tensor = self.constants.get(name)
        if tensor is None or np.prod(tensor.dims, dtype=np.int64) > 8:
            return None
        return numpy_helper.to_array(tensor).reshape(-1).tolist()


def _rotation_at(neg, g: GraphIndex) -> _Rotation | None:
    """The rotation `Add(Mul(x, cos'), Mul(Concat(Neg(x[..., D/2:]), x[..., :D/2]), sin'))` around `neg`
    (cos' = Unsqueeze(cos, 1)), or None."""
    upper = g.producer.get(neg.input[0])
    concat = g.only_user(neg.output[0], "Concat")
    if upper is None or upper.op_type != "Slice" or concat is None or list(concat.input[:1]) != [neg.output[0]]:
        return None
    x = upper.input[0]
    lower = g.producer.get(concat.input[1]) if len(concat.input) == 2 else None
    width = g.last_dim(x)
    if lower is None or lower.op_type != "Slice" or lower.input[0] != x or width is None or width % 2:
        return None
    half = width // 2
    if not (
        _is_slice(lower, g, 0, half, width)
        and _is_slice(upper, g, half, None, width)
        and _axis(concat, width, g.dims(x))
    ):
        return None
    if len(g.consumers[lower.output[0]]) != 1 or len(g.consumers[upper.output[0]]) != 1:
        return None
    mul_sin = g.only_user(concat.output[0], "Mul")
    add = g.only_user(mul_sin.output[0], "Add") if mul_sin is not None else None
    if add is None:
        return None
    mul_cos = g.producer.get(_other(add, mul_sin.output[0]))
    if (
        mul_cos is None
        or mul_cos.op_type != "Mul"
        or x not in mul_cos.input
        or len(g.consumers[mul_cos.output[0]]) != 1
    ):
        return None
    cos, sin = _heads_unsqueezed(_other(mul_cos, x), g), _heads_unsqueezed(_other(mul_sin, concat.output[0]), g)
    if cos is None or sin is None or len(g.dims(x) or []) != 4:
        return None
    return _Rotation(x, cos, sin, [mul_cos, lower, upper, neg, concat, mul_sin, add])


def _other(node, name: str) -> str | None:
    rest = [i for i in node.input if i != name]
    return rest[0] if len(rest) == 1 and len(node.input) == 2 else None


def _is_slice(node, g: GraphIndex, start: int, end: int | None, width: int) -> bool:
    """node slices [start, end) of the last axis (end None: to the end), step 1."""
    args = [g.value(i) if i else None for i in list(node.input[1:]) + [""] * (4 - len(node.input[1:]))]
    starts, ends, axes, steps = args
    if starts != [start] or ends is None or len(ends) != 1 or axes not in ([-1], [3]) or steps not in (None, [1]):
        return False
    return ends[0] >= width if end is None else ends[0] == end


def _axis(concat, width: int, dims) -> bool:
    axis = next((a.i for a in concat.attribute if a.name == "axis"), None)
    return dims is not None and axis in (-1, len(dims) - 1)


def _heads_unsqueezed(name: str | None, g: GraphIndex) -> str | None:
    """t when name = Unsqueeze(t, [1]) (a [B, S, D] table broadcast over the heads of [B, H, S, D])."""
    node = g.producer.get(name) if name else None
    if node is None or node.op_type != "Unsqueeze" or g.value(node.input[1]) != [1]:
        return None
    return node.input[0]


def _tables(model, g: GraphIndex, cos: str, sin: str, max_positions: int):
    """(cos_cache, sin_cache) [max_positions, D/2] when cos and sin are exact rotate-half tables of
    `position_ids`; else why not (a str)."""
    nodes = _ancestors(g, [cos, sin])
    if nodes is None:
        return "its cos/sin depend on more than position_ids"
    run = _subgraph_session(model, g, nodes, [cos, sin])
    if run is None:
        return "its cos/sin have no recorded type, or do not load apart from the graph"
    every = np.arange(max_positions, dtype=np.int64)[None]
    try:
        table_cos, table_sin = run(every)
    except Exception as exc:  # onnxruntime raises its own types for a subgraph it cannot run alone
        return f"its cos/sin do not run apart from the graph: {type(exc).__name__}"
    if table_cos.ndim != 3 or table_cos.shape[:2] != (1, max_positions) or table_cos.shape != table_sin.shape:
        return f"its cos/sin tables have shape {table_cos.shape}, not [batch, window, head_dim]"
    half = table_cos.shape[-1] // 2
    if any(not np.array_equal(t[..., :half], t[..., half:]) for t in (table_cos, table_sin)):
        return "its cos/sin halves differ (not rotate-half)"
    sample = np.random.default_rng(0).integers(0, max_positions, (2, 7))
    for table, got in zip((table_cos, table_sin), run(sample)):
        if not np.array_equal(table[0][sample], got):
            return "its cos/sin at a position depend on the batch's other positions"
    return table_cos[0, :, :half].copy(), table_sin[0, :, :half].copy()


def _ancestors(g: GraphIndex, names: list[str]) -> list | None:
    """The nodes computing `names` from position_ids and constants (in graph order); None if anything else
    feeds them."""
    found, stack = {}, list(names)
    while stack:
        name = stack.pop()
        if not name or name == POSITIONS or (name in g.constants and name not in g.producer):
            continue
        node = g.producer.get(name)
        if node is None:
            return None
        if id(node) not in found:
            found[id(node)] = node
            stack.extend(node.input)
    return sorted(found.values(), key=lambda n: g.index[id(n)])


def _subgraph_session(model, g: GraphIndex, nodes: list, outputs: list[str]):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if any(o not in g.values for o in outputs):
        return None
    needed = {i for n in nodes for i in n.input}
    initializers = [i for i in model.graph.initializer if i.name in needed]
    graph = helper.make_graph(
        nodes,
        "rotary_tables",
        [helper.make_tensor_value_info(POSITIONS, TensorProto.INT64, ["b", "s"])],
        [g.values[o] for o in outputs],
        initializers,
    )
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    try:
        session = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001  (a subgraph onnxruntime cannot load alone: left as traced)
        return None
    return lambda positions: session.run(outputs, {POSITIONS: positions})


def _add(graph, g: GraphIndex, tensor) -> str:
    base, k = tensor.name, 0
    while tensor.name in g.constants or tensor.name in g.producer:
        k += 1
        tensor.name = f"{base}_{k}"
    graph.initializer.append(tensor)
    g.constants[tensor.name] = None
    return tensor.name


def drop_unread_initializers(graph, before: GraphIndex) -> None:
    """Remove the initializers that nodes of the graph indexed in `before` read and no node reads now
    (constants only the rewritten nodes used; onnxruntime warns about each unused one on every load)."""
    read = {i for n in graph.node for i in n.input}
    dropped = {i for n in before.producer.values() for i in n.input} - read
    kept = [i for i in graph.initializer if i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def live_nodes(nodes: list, outputs: set[str]) -> list:
    """`nodes` without those whose outputs nothing reads (the traced cos/sin, now tables)."""
    while True:
        read = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if any(o in read for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def attribute(node, name: str, default):
    """A node attribute's value (int, float, list ...), or `default` when the node does not set it."""
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
