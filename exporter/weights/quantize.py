"""The weight pass: an exported graph file -> the same graph on block-quantized weights.

Each MatMul whose weight is planned becomes `com.microsoft.MatMulNBits` (no zero-point input:
the implied 8 / 128 is the fast kernel path), plus, for blocks with an offset (GGUF Q4_1),

    y = MatMulNBits(x; q, d) + blocksum(x) @ offsets.T

where blocksum(x) sums x over each block of 32, once per distinct input, as ReduceSum over a
constant-shape Reshape (BLOCK_SUMS = "reduce"; a 0/1 block-matrix MatMul when x's rank is not
recorded). BLOCK_SUMS = "columns" instead has the same MatMulNBits emit them as K/32 extra output
columns (`with_block_sums`: one indicator row per block, scale 1, exact in 4 bits), so at level 4
they are the sums of the int8-rounded activations, as llama.cpp's Q4_1 x Q8_1 dot product uses:
120 fewer nodes on SmolLM2, but not measurably faster, so not the default. Sibling MatMuls that read one input with
blocks of one layout (q/k/v, gate/up) become one MatMulNBits over their concatenated outputs and
a Split: each output column is computed exactly as alone, with a third of the small nodes around
it (onnxruntime's cost here is per node, not per column). An embedding Gather whose table is
planned becomes `com.microsoft.GatherBlockQuantized` on the same bytes. The pass works on one
ONNX file at a time, so every graph variant of an artifact gets it; the plan comes from a GGUF
file's own blocks (`gguf_weights.py`) or from rounding the floats (`--quantize`).

The pass holds one weight at a time: the graph is loaded without its external data, a weight is
read (memory-mapped) when its blocks are made, and every array written goes straight to the
artifact's one weights file (`weight_file.py`), which both graphs of the artifact read: the in-place
graph's packed q|k|v is the portable graph's stacked siblings, the same bytes, stored once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np

from ..attention.gqa_rows import pad_attention_rows, wanted
from ..graph.rotary import attribute, fuse_rotary, live_nodes
from ..graph.skip_norms import fuse_skip_norms
from .blocks import BLOCK, BlockMatrix, quantize_float
from .gguf_weights import Candidate, Planned, WeightPlan
from .graph_weights import INLINE_BELOW, GraphWeights, raw_bytes
from .weight_file import WeightFile, point_at

BITS = {"int8": 8, "int4": 4}
MS_DOMAIN = "com.microsoft"
# Q4_1 block sums: "reduce" (Reshape + ReduceSum) or "columns" (K/32 extra MatMulNBits outputs: not faster, measured)
BLOCK_SUMS = "reduce"

Planner = Callable[[list[Candidate]], WeightPlan]


@dataclass
class WeightReport:
    """What the pass did, for the manifest (the same for every graph variant of one export)."""

    kind: str  # "gguf", "int4", "int8"
    accuracy_level: int
    tensor_types: dict[str, int] = field(default_factory=dict)  # blocks' type -> tensors quantized
    kept_float: dict[str, int] = field(default_factory=dict)  # tensor type -> tensors left float
    messages: list[str] = field(default_factory=list)  # why, one line each, naming tensor and type
    graph_bytes: dict[str, int] = field(
        default_factory=dict
    )  # file -> size on disk: each graph file, their one weights file
    attention_extra_row: bool = False  # the in-place graph's attention has gqa_rows.py's extra row

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "accuracy_level": self.accuracy_level,
            "tensor_types": self.tensor_types,
            "kept_float": self.kept_float,
            "exact": self.kind == "gguf",
            "graph_bytes": self.graph_bytes,
            "attention_extra_row": self.attention_extra_row,
        }


def float_planner(kind: str) -> Planner:
    """--quantize int4|int8: round each MatMul weight (K a multiple of 32); tables stay float."""
    bits = BITS[kind]

    def plan(candidates: list[Candidate]) -> WeightPlan:
        out = WeightPlan()
        for c in candidates:
            if not c.name.startswith("gather:") and c.shape[1] % BLOCK == 0:
                out.matrices[c.name] = Planned(
                    kind,
                    bits,
                    BLOCK,
                    c.shape,
                    False,
                    lambda c=c: quantize_float(c.read(), bits),
                    c.name if c.stored is None else c.stored,
                )
        return out

    return plan


def quantize_graph_file(
    source: Path,
    target: Path,
    planner: Planner,
    accuracy_level: int,
    siblings: bool = True,
    max_positions: int | None = None,
    weights: WeightFile | None = None,
) -> WeightPlan:
    """Read SOURCE (its weights one at a time, from wherever its protos point), apply the planned blocks,
    write TARGET with every initializer of 1 KiB or more in `weights` (a WeightFile in TARGET's folder,
    shared by the artifact's graphs; None: TARGET.data of its own).
    siblings: MatMuls of one input share one MatMulNBits (False: one each, as a reference).
    max_positions: the rotary tables' length, for com.microsoft.RotaryEmbedding (rotary.py); None leaves rotary
    as traced."""
    import onnx

    if weights is None:
        with WeightFile(Path(target).parent, Path(target).name + ".data") as own:
            return quantize_graph_file(source, target, planner, accuracy_level, siblings, max_positions, own)
    if weights.path.parent.resolve() != Path(target).parent.resolve():
        raise ValueError(f"{target}'s weights must be written beside it, not in {weights.path.parent}")
    model = onnx.load(str(source), load_external_data=False)
    values = GraphWeights(Path(source).parent)
    values.inline_small(model)
    fold_transposed_weights(model, values)
    plan = planner(weight_candidates(model, values))
    matrices = {_initializer(k): v for k, v in plan.matrices.items()}
    tables = {_initializer(k) for k in plan.matrices if k.startswith("gather:")}
    written = rewrite(model, matrices, tables, accuracy_level, siblings, weights)
    fuse_skip_norms(model)  # the graph holds contrib ops now: onnxruntime-only
    if wanted(accuracy_level):  # int8 activations: GroupQueryAttention's one-row path must not be taken
        plan.padded_attention = pad_attention_rows(model)  # the trace's row kept, a graphs_from source's added
    if max_positions is not None:
        fuse_rotary(model, max_positions)
    values.write_rest(model, weights, written)
    save_model(model, target)
    return plan


def _initializer(key: str) -> str:
    return key.split(":", 1)[1] if key.startswith("gather:") else key


def weight_candidates(model, values: GraphWeights) -> list[Candidate]:
    """Weights a pass may quantize, as W [N, K] float32, in graph order, none read yet: "NAME" for
    MatMul(x, NAME) (stored [K, N]: W is its transposed view) or a part of MatMul(x, Concat(NAME, ...))
    (gqa_packed.py's q|k|v), "gather:NAME" for an embedding Gather(NAME, ids) on axis 0 (stored [V, K])."""
    from onnx import TensorProto

    inits = {i.name: i for i in model.graph.initializer if i.data_type == TensorProto.FLOAT and len(i.dims) == 2}
    producer = {o: n for n in model.graph.node for o in n.output}
    out: dict[str, Candidate] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul":
            for name in weight_parts(node, producer, inits) or []:
                k, n = inits[name].dims
                out.setdefault(
                    name, Candidate(name, (n, k), lambda p=inits[name]: values.read(p).T, values.stored(inits[name]))
                )
        elif node.op_type == "Gather" and node.input[0] in inits and attribute(node, "axis", 0) == 0:
            table = inits[node.input[0]]
            stored = values.stored(table)
            out.setdefault(
                "gather:" + table.name,
                Candidate(
                    "gather:" + table.name,
                    tuple(table.dims),
                    lambda p=table: values.read(p),
                    None if stored is None else ("gather", *stored),
                ),
            )
    return list(out.values())


def weight_parts(matmul, producer: dict, inits) -> list[str] | None:
    """The weight initializers of MatMul(x, W): [W], or the parts of a Concat of them on the output axis."""
    weight = matmul.input[1]
    if weight in inits:
        return [weight]
    concat = producer.get(weight)
    if (
        concat is not None
        and concat.op_type == "Concat"
        and attribute(concat, "axis", 0) in (1, -1)
        and all(name in inits and name not in producer for name in concat.input)
    ):
        return list(concat.input)
    return None


def rewrite(
    model,
    matrices: dict[str, Planned | BlockMatrix],
    tables: set[str],
    accuracy_level: int,
    siblings: bool = True,
    weights: WeightFile | None = None,
) -> set[str]:
    """Replace the MatMuls (and, for names in `tables`, the Gathers) of the planned initializers; the
    arrays of 1 KiB or more go to `weights` as they are made (None: into the graph). Returns the names
    of the initializers written to `weights`."""
    from onnx import helper

    graph = model.graph
    matrices = {k: m if isinstance(m, Planned) else Planned.of(m, k) for k, m in matrices.items()}
    emit = _Emitter(graph, weights)
    groups = sibling_groups(graph.node, matrices, tables, siblings)
    producer = {o: n for n in graph.node for o in n.output}
    nodes = []
    for node in graph.node:
        parts = (
            weight_parts(node, producer, matrices)
            if node.op_type == "MatMul" and node.input[1] not in matrices
            else None
        )
        if node.op_type == "MatMul" and node.input[1] in matrices and node.input[1] not in tables:
            group = groups.get(node.output[0])
            if group:  # the group is emitted where its first member was; the others are dropped
                nodes += replacing(node, emit.matmuls(group, [matrices[n.input[1]] for n in group], accuracy_level))
        elif parts:  # packed q|k|v: one MatMulNBits, no Split (one per block layout, then a Concat, when they differ)
            nodes += replacing(node, emit.packed(node, [matrices[p] for p in parts], accuracy_level))
        elif node.op_type == "Gather" and node.input[0] in tables:
            nodes += replacing(node, emit.gather(node, matrices[node.input[0]]))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(live_nodes(nodes, {o.name for o in graph.output}))  # the Concats of quantized parts
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + emit.initializers)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return emit.written


REPLACES = "jacobi_rt.replaces"  # a made node's metadata: the name of the node it replaces


def replacing(origin, made: list) -> list:
    """The nodes made for `origin`, each carrying its metadata (the module scopes) and its name under
    REPLACES: what the layer check's graph cutting (layer_graph.py) knows a node's layer by."""
    for node in made:
        node.metadata_props.extend(origin.metadata_props)
        node.metadata_props.add(key=REPLACES, value=origin.name)
    return made


def _layout(m: Planned) -> tuple:
    """What block matrices must share for one MatMulNBits to hold them side by side."""
    return m.bits, m.block, m.shape[1], not m.has_offsets


def sibling_groups(nodes, matrices: dict[str, Planned], tables: set[str], siblings: bool = True) -> dict[str, list]:
    """Planned MatMuls grouped by (input, block layout), in graph order: first member's output -> the
    group, every other member's output -> [] (emitted with its group). siblings=False: groups of one."""
    groups: dict[tuple, list] = {}
    for node in nodes:
        if node.op_type == "MatMul" and node.input[1] in matrices and node.input[1] not in tables:
            m = matrices[node.input[1]]
            key = (node.input[0], *_layout(m)) if siblings else (node.output[0],)
            groups.setdefault(key, []).append(node)
    out: dict[str, list] = {}
    for group in groups.values():
        out[group[0].output[0]] = group
        out.update({n.output[0]: [] for n in group[1:]})
    return out


class _Emitter:
    """Builds the quantized nodes, writing each array as it is made (to `weights` when given); a planned
    matrix's arrays are stored once per ident, however many nodes read them. Only the protos are kept."""

    def __init__(self, graph, weights: WeightFile | None = None):
        self.initializers = []
        self.written: set[str] = set()  # initializers whose data is in `weights`
        self._weights = weights
        self._arrays: dict[object, tuple[str, str, str | None]] = {}
        self._blocksums: dict[tuple[str, int], str] = {}
        self._constants: dict[tuple, str] = {}
        self._ranks = {
            v.name: len(v.type.tensor_type.shape.dim)
            for v in [*graph.input, *graph.value_info]
            if v.type.tensor_type.HasField("shape")
        }
        self._taken = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
        self._names = 0

    def _name(self, base: str) -> str:
        while True:
            self._names += 1
            name = f"{base}_q{self._names}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def _add(self, array: np.ndarray, base: str) -> str:
        from onnx import TensorProto, helper, numpy_helper

        name = self._name(base)
        array = np.ascontiguousarray(array)
        if self._weights is None or array.nbytes < INLINE_BELOW:
            self.initializers.append(numpy_helper.from_array(array, name))
        else:
            proto = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
            point_at(proto, self._weights.name, self._weights.add(raw_bytes(array)))
            self.initializers.append(proto)
            self.written.add(name)
        return name

    def arrays(self, m: Planned, base: str, made: BlockMatrix | None = None) -> tuple[str, str, str | None]:
        """The names of m's blocks, scales and offsets (transposed), written now unless m's ident has them."""
        if m.ident is not None and m.ident in self._arrays:
            return self._arrays[m.ident]
        made = made or m.make()
        offsets = None if made.offsets is None else self._add(made.offsets.T, base + "_offsets")
        names = (self._add(made.packed(), base + "_blocks"), self._add(made.scales, base + "_scales"), offsets)
        if m.ident is not None:
            self._arrays[m.ident] = names
        return names

    def matmuls(self, nodes: list, ms: list[Planned], accuracy_level: int) -> list:
        """MatMuls of one input: one quantized MatMul over the concatenated outputs, then a Split."""
        from onnx import helper

        if len(nodes) == 1:
            return self.matmul(nodes[0], ms[0], accuracy_level)
        joined = self._name(nodes[0].output[0] + "_siblings")
        weight = self._name(nodes[0].input[1] + "_siblings")
        fused = helper.make_node(
            "MatMul", [nodes[0].input[0], weight], [joined], name=self._name(nodes[0].name or "matmul")
        )
        sizes = self._constant([m.shape[0] for m in ms])
        split = helper.make_node(
            "Split", [joined, sizes], [n.output[0] for n in nodes], name=self._name("split"), axis=-1
        )
        return self.matmul(fused, Planned.stack(ms), accuracy_level) + [split]

    def packed(self, node, ms: list[Planned], accuracy_level: int) -> list:
        """MatMul(x, Concat(parts)) as one MatMulNBits over the stacked parts; parts of different block
        layouts (a GGUF may store v in another type than q and k) as one per run of a layout, concatenated."""
        from onnx import helper

        runs = [list(run) for _, run in groupby(ms, key=_layout)]
        if len(runs) == 1:
            return self.matmul(node, Planned.stack(ms), accuracy_level)
        outputs = [self._name(f"{node.output[0]}_part{i}") for i in range(len(runs))]
        out = []
        for run, y in zip(runs, outputs):
            part = helper.make_node("MatMul", [node.input[0], self._name(node.input[1] + "_part")], [y], name=node.name)
            out += self.matmul(part, Planned.stack(run), accuracy_level)
        return out + [helper.make_node("Concat", outputs, [node.output[0]], name=self._name("concat"), axis=-1)]

    def matmul(self, node, m: Planned, accuracy_level: int) -> list:
        from onnx import helper

        x, weight = node.input[0], node.input[1]
        if m.has_offsets and BLOCK_SUMS == "columns" and (x, m.block) not in self._blocksums:
            return self.matmul_with_sums(node, m, accuracy_level)
        n, k = m.shape
        blocks, scales, offsets = self.arrays(m, weight)
        y = node.output[0]
        main = y if offsets is None else self._name(y + "_nbits")
        out = [
            helper.make_node(
                "MatMulNBits",
                [x, blocks, scales],
                [main],
                name=self._name(node.name or "matmul"),
                domain=MS_DOMAIN,
                K=k,
                N=n,
                bits=m.bits,
                block_size=m.block,
                accuracy_level=accuracy_level,
            )
        ]
        if offsets is not None:
            sums, made = self.blocksum(x, k // m.block, m.block)
            correction = self._name(y + "_offset")
            out += made + [
                helper.make_node("MatMul", [sums, offsets], [correction]),
                helper.make_node("Add", [main, correction], [y]),
            ]
        return out

    def matmul_with_sums(self, node, m: Planned, accuracy_level: int) -> list:
        """The offset form with x's block sums computed by the MatMulNBits itself, as K/32 extra output
        columns (an indicator row per block: scale 1, q = zero + 1 in its block, zero elsewhere), then
        Split(main, sums), MatMul(sums, offsets) and Add: no Reshape/ReduceSum."""
        from onnx import helper

        x, y = node.input[0], node.output[0]
        n, k = m.shape
        nb = k // m.block
        made = m.make()
        offsets = self._add(made.offsets.T, node.input[1] + "_offsets")
        joined = self._name(y + "_withsums")
        out = self.matmul(
            helper.make_node("MatMul", [x, node.input[1] + "_sums"], [joined], name=node.name),
            Planned.of(with_block_sums(made)),
            accuracy_level,
        )
        main, sums, correction = self._name(y + "_nbits"), self._name(x + "_blocksum"), self._name(y + "_offset")
        self._blocksums[(x, m.block)] = sums
        return out + [
            helper.make_node(
                "Split", [joined, self._constant([n, nb])], [main, sums], name=self._name("split"), axis=-1
            ),
            helper.make_node("MatMul", [sums, offsets], [correction]),
            helper.make_node("Add", [main, correction], [y]),
        ]

    def blocksum(self, x: str, blocks: int, width: int) -> tuple[str, list]:
        """x summed over each block of `width` along its last axis, [..., K] -> [..., K/width]."""
        from onnx import helper

        key = (x, width)
        if key in self._blocksums:
            return self._blocksums[key], []
        sums = self._name(x + "_blocksum")
        rank = self._ranks.get(x)
        if rank:  # Reshape (0 keeps a dimension) and ReduceSum: two cheap nodes
            grouped = self._name(x + "_blocks")
            made = [
                helper.make_node("Reshape", [x, self._constant([0] * (rank - 1) + [blocks, width])], [grouped]),
                helper.make_node("ReduceSum", [grouped, self._constant([-1])], [sums], keepdims=0),
            ]
        else:  # any rank: one MatMul with a 0/1 block-indicator matrix [K, K/width]
            indicator = np.kron(np.eye(blocks, dtype=np.float32), np.ones((width, 1), np.float32))
            made = [helper.make_node("MatMul", [x, self._constant(indicator)], [sums])]
        self._blocksums[key] = sums
        return sums, made

    def _constant(self, values) -> str:
        """One initializer per distinct constant (shapes, axes, indicators), however many nodes read it."""
        array = np.asarray(values, dtype=np.int64 if isinstance(values, list) else None)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self._add(array, "constant")
        return self._constants[key]

    def gather(self, node, m: Planned) -> list:
        from onnx import helper

        table, ids = node.input[0], node.input[1]
        n, k = m.shape
        made = m.make() if m.has_offsets else None  # row_offsets reads its offsets
        blocks, scales, _ = self.arrays(m, table, made)
        flat, shape = (
            self._name(table + "_rows"),
            self._add(np.array([n, k * m.bits // 8], np.int64), table + "_rowshape"),
        )
        rows = node.output[0] if made is None else self._name(node.output[0] + "_nbits")
        out = [
            helper.make_node("Reshape", [blocks, shape], [flat]),
            helper.make_node(
                "GatherBlockQuantized",
                [flat, ids, scales],
                [rows],
                name=self._name(node.name or "gather"),
                domain=MS_DOMAIN,
                gather_axis=0,
                quantize_axis=1,
                block_size=m.block,
                bits=m.bits,
            ),
        ]
        return out if made is None else out + self.row_offsets(rows, ids, made, table, node.output[0])

    def row_offsets(self, rows: str, ids: str, m: BlockMatrix, table: str, y: str) -> list:
        """Gathered rows [.., K] plus each row's block offsets (gathered from [V, K/block]), added per block:
        scale*(q - zero) is exact in float32, so the one rounding of the Add gives the GGUF's value."""
        from onnx import helper

        n, k = m.shape
        keep = [0] * self._ranks.get(ids, 2)  # Reshape's 0: the ids' dimensions as they are
        offsets, grouped, spread, summed = (
            self._name(y + suffix) for suffix in ("_offsets", "_blocks", "_spread", "_sum")
        )
        return [
            helper.make_node("Gather", [self._add(m.offsets, table + "_row_offsets"), ids], [offsets], axis=0),
            helper.make_node("Reshape", [rows, self._constant(keep + [k // m.block, m.block])], [grouped]),
            helper.make_node("Unsqueeze", [offsets, self._constant([-1])], [spread]),
            helper.make_node("Add", [grouped, spread], [summed]),
            helper.make_node("Reshape", [summed, self._constant(keep + [k])], [y]),
        ]


def with_block_sums(m: BlockMatrix) -> BlockMatrix:
    """m's rows without offsets, then one indicator row per block (q = zero + 1 inside it, zero outside,
    scale 1): MatMulNBits over it gives x @ (m's first term).T and x's sum over each block."""
    n, k = m.shape
    nb = k // m.block
    indicator = np.full((nb, nb, m.block), m.zero, np.uint8)
    indicator[np.arange(nb), np.arange(nb)] = m.zero + 1
    return BlockMatrix(
        m.kind,
        m.bits,
        m.block,
        np.concatenate([m.q, indicator.reshape(nb, k)]),
        np.concatenate([m.scales, np.ones((nb, nb), np.float32)]),
    )


def save_model(model, path: Path) -> None:
    """The graph file alone: its initializers of 1 KiB or more point into the artifact's weights file already."""
    import onnx

    path.unlink(missing_ok=True)
    onnx.save_model(model, str(path))


def fold_transposed_weights(model, values: GraphWeights) -> int:
    """Replace MatMul(x, Transpose(W)) by MatMul(x, W^T), W^T an initializer of its own (read as a view of W).

    A tied LM head reads the embedding table through a Transpose; the quantizer only sees
    MatMuls whose weight is an initializer, so without this the largest matrix stays float.
    The embedding Gather keeps the original table.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in initializers:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(u.op_type != "MatMul" or list(u.input).index(node.output[0]) != 1 for u in users):
            continue
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        graph.initializer.append(
            values.transposed(initializers[node.input[0]], node.output[0], perm[0] if perm else None)
        )
        graph.node.remove(node)
        folded += 1
    return folded
