"""Trace three decoder layers, write the rest: a window graph of N like layers from a trace of three.

torch.onnx.export's time grows with the layers it traces (torch.export, decompositions, type
promotion: about 1.5 s a layer of SmolLM2's 30, twice, one graph after the other), yet the layers
of most models are one graph with other weights. So the model is traced with its first three
layers, unoptimized (the parameters still carry their module names), and layers 3..N-1 are
written into that ONNX graph as copies of layer 2, each reading its own weights and past and the
layer before it; the tail (final norm, head, argmax) then reads the last one. onnxscript's
optimizer runs on the whole graph afterwards, as it would on a full trace.

    traced:    prelude | layer 0 | layer 1 | layer 2 | tail
    written:   prelude | layer 0 | layer 1 | layer 2 | layer 3 ... layer N-1 | tail
                                   `--- f ---^  (layer 2 = layer 1 shifted: checked node by node)

Layer 0 differs from the others in the trace (shape computations land in the first layer that
uses them), so layer 2 is the template and layer 1 proves it: every node of layer 2 must be layer
1's with every layer-1 input replaced by its layer-2 counterpart (weights and past by name, the
layer before by position). Layers beyond the trace must be alike in their modules (types and
settings: Gemma's sliding and global layers, SmolLM3's layers without rope are not), or the
whole model is traced. Nodes are assigned to layers by the module scope torch.onnx records on
each (`pkg.torch.onnx.name_scopes`).
"""

from __future__ import annotations

import ast
import contextlib
import re

import torch

TRACED = 3  # layers traced: layer 0 (different), layer 1 (the proof), layer 2 (the template)
SCOPES = "pkg.torch.onnx.name_scopes"
PER_LAYER_INPUT = re.compile(r"^(past_key_values|present)\.(\d+)\.(key|value)$")


class NotStitchable(Exception):
    """The traced layers are not copies of one another; the reason says where."""


def decoder_layers(model) -> tuple[str, torch.nn.ModuleList] | None:
    """(dotted path, ModuleList) of `model`'s decoder layers: the ModuleList with num_hidden_layers
    children of one type."""
    count = getattr(model.config, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) == count
            and count
            and len({type(m) for m in module}) == 1
            and hasattr(module[0], "forward")
        ):
            return name, module
    return None


def _settings(module: torch.nn.Module) -> tuple:
    """A layer's module tree as data: types, scalar settings (but its index), parameter shapes."""
    plain = (int, float, bool, str, type(None))
    rows = []
    for name, sub in module.named_modules():
        values = {
            k: v
            for k, v in vars(sub).items()
            if not k.startswith("_")
            and k not in ("layer_idx", "layer_id", "layer_number")
            and (isinstance(v, plain) or (isinstance(v, (tuple, list)) and all(isinstance(x, plain) for x in v)))
        }
        rows.append((name, type(sub).__qualname__, tuple(sorted((k, repr(v)) for k, v in values.items()))))
    rows.append(tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()))
    rows.append(tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()))
    return tuple(rows)


def layers_to_trace(model, num_layers: int) -> tuple[int, str | None]:
    """(layers to trace, why all of them): TRACED when the layers past it can be written as copies."""
    if num_layers <= TRACED:
        return num_layers, "too few layers to gain"
    found = decoder_layers(model)
    if found is None:
        return num_layers, "no ModuleList of num_hidden_layers alike layers"
    _, layers = found
    reference = _settings(layers[TRACED - 1])
    for i in range(TRACED - 2, len(layers)):
        if _settings(layers[i]) != reference:
            return num_layers, f"layer {i} differs from layer {TRACED - 1} in its modules or settings"
    types = getattr(model.config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(set(types[TRACED - 2 :])) > 1:
        return num_layers, f"layer_types vary ({sorted(set(types))})"
    return TRACED, None


@contextlib.contextmanager
def first_layers(model, count: int):
    """Within the block `model` has its first `count` decoder layers (config included); restored on exit."""
    found = decoder_layers(model)
    if found is None or count >= len(found[1]):
        yield
        return
    name, layers = found
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    attribute = name.rpartition(".")[2]
    config = model.config
    saved = {k: getattr(config, k) for k in ("num_hidden_layers", "layer_types") if hasattr(config, k)}
    setattr(parent, attribute, torch.nn.ModuleList(list(layers)[:count]))
    config.num_hidden_layers = count
    if isinstance(saved.get("layer_types"), list):
        config.layer_types = saved["layer_types"][:count]
    try:
        yield
    finally:
        setattr(parent, attribute, layers)
        for k, v in saved.items():
            setattr(config, k, v)


def _layer_of(node, prefix: str) -> int | None:
    scopes = node.metadata_props.get(SCOPES)
    if not scopes:
        return None
    for scope in ast.literal_eval(scopes):
        if scope.startswith(prefix) and scope[len(prefix) :].isdigit():
            return int(scope[len(prefix) :])
    return None


def _attributes_equal(a, b) -> bool:
    if set(a.attributes) != set(b.attributes):
        return False
    for key, attr in a.attributes.items():
        other = b.attributes[key]
        if attr.type != other.type:
            return False
        if attr.type.name in ("GRAPH", "GRAPHS"):
            return False  # subgraphs are not copied
        if attr.type.name in ("TENSOR", "TENSORS"):
            mine, theirs = (
                ([attr.value], [other.value]) if attr.type.name == "TENSOR" else (list(attr.value), list(other.value))
            )
            if [_bytes(t) for t in mine] != [_bytes(t) for t in theirs]:
                return False
        elif attr.value != other.value:
            return False
    return True


def _bytes(tensor) -> tuple:
    array = tensor.numpy()
    return array.dtype.str, array.shape, array.tobytes()


def _renamed(name: str, frm: int, to: int, prefix: str) -> str | None:
    """The layer-`to` counterpart of a per-layer name of layer `frm` (None if not per-layer)."""
    if name.startswith(f"{prefix}{frm}."):
        return f"{prefix}{to}." + name[len(f"{prefix}{frm}.") :]
    m = PER_LAYER_INPUT.match(name)
    if m and int(m.group(2)) == frm:
        return f"{m.group(1)}.{to}.{m.group(3)}"
    return None


def _same_constant(a, b) -> bool:
    if a.const_value is None or b.const_value is None:
        return False
    return _bytes(a.const_value) == _bytes(b.const_value)


def extend_layers(
    model, prefix: str, total: int, tensors: dict[str, torch.Tensor], input_names: list[str], output_names: list[str]
) -> None:
    """Rewrite `model` (onnx_ir, unoptimized, traced with TRACED layers whose modules are `prefix`0..)
    into `total` layers, in place: layers TRACED.. copy layer TRACED-1 with their own weights
    (`tensors`, by name) and past; `input_names`, `output_names`: the written graph's, in order.
    Raises NotStitchable if layer TRACED-1 is not layer TRACED-2 shifted (then trace every layer)."""
    stitch = _Stitch(model.graph, prefix, tensors)
    stitch.prove()
    stitch.write(total, input_names, output_names)


class _Stitch:
    def __init__(self, graph, prefix: str, tensors: dict):
        self.graph, self.prefix, self.tensors = graph, prefix, tensors
        self.proof, self.template = TRACED - 2, TRACED - 1
        nodes = list(graph)
        kinds = [_layer_of(n, prefix) for n in nodes]
        if all(k is None for k in kinds):
            raise NotStitchable(f"no node carries a {prefix}N module scope")
        first = next(i for i, k in enumerate(kinds) if k is not None)
        last = max(i for i, k in enumerate(kinds) if k is not None)
        blocks = [k for i, k in enumerate(kinds[first : last + 1]) if i == 0 or k != kinds[first + i - 1]]
        if blocks != list(range(TRACED)):
            raise NotStitchable(f"the traced layers are not in order, one block each: {blocks}")
        self.body = {k: [n for n, kind in zip(nodes, kinds) if kind == k] for k in range(TRACED)}
        self.tail = nodes[last + 1 :]
        self.owner = {}  # id(value) -> the traced layer that computes it, or "prelude" / "tail"
        for i, (n, kind) in enumerate(zip(nodes, kinds)):
            for out in n.outputs:
                self.owner[id(out)] = kind if kind is not None else ("tail" if i > last else "prelude")
        self.shift = {}  # id(value of layer `proof` or `proof - 1`) -> the same value one layer later
        self.lifted = set()  # id(template-side prelude values, inputs, initializers) that each layer has its own of

    def prove(self) -> None:
        """Check node by node that the template layer is the proof layer one layer later."""
        a_nodes, b_nodes = self.body[self.proof], self.body[self.template]
        if len(a_nodes) != len(b_nodes):
            raise NotStitchable(f"layer {self.template} has {len(b_nodes)} nodes, layer {self.proof} {len(a_nodes)}")
        for a_node, b_node in zip(a_nodes, b_nodes):
            if not _same_node(a_node, b_node):
                raise NotStitchable(
                    f"layer {self.template}'s {b_node.op_type} {b_node.name} "
                    f"is not layer {self.proof}'s {a_node.op_type}"
                )
            for a, b in zip(a_node.outputs, b_node.outputs):
                self.shift[id(a)] = b
            for a, b in zip(a_node.inputs, b_node.inputs):
                if not self._follows(a, b):
                    raise NotStitchable(
                        f"{b_node.name}: input {getattr(b, 'name', None)} is not the layer-{self.template} "
                        f"counterpart of {getattr(a, 'name', None)}"
                    )
        for value in self.graph.outputs:
            if self.owner.get(id(value)) == self.proof and self.shift[id(value)].name != self._renamed(
                value.name, self.template
            ):
                raise NotStitchable(f"output {value.name}'s counterpart is not an output of layer {self.template}")

    def _renamed(self, name: str | None, to: int, frm: int | None = None) -> str | None:
        return _renamed(name or "", self.proof if frm is None else frm, to, self.prefix)

    def _follows(self, a, b) -> bool:
        """Is b (read by the template layer) what a (read by the proof layer) is one layer later?"""
        if a is None or b is None:
            return a is b
        source = self.owner.get(id(a))
        if a is b:  # one value every layer reads (a size the first layer computed, a prelude constant)
            return source not in (self.proof, self.template)
        if source == self.proof:
            return self.shift.get(id(a)) is b
        if source == self.proof - 1:  # the layer before: the chain of hidden states
            return self.owner.get(id(b)) == self.proof and self.shift.setdefault(id(a), b) is b
        if source != "prelude" and source is not None:
            return False
        if source is None:  # graph input or initializer
            renamed = self._renamed(a.name, self.template)
            if renamed is not None and b.name == renamed and (b.is_graph_input() or b.name in self.tensors):
                self.lifted.add(id(b))  # each layer's own weight or past
                return True
            # a constant the trace lifted per layer (numbered, so not by name): alike, so every copy may read it
            return a.is_initializer() and b.is_initializer() and _same_constant(a, b)
        b_node, a_node = b.producer(), a.producer()  # a prelude node of each layer's own (the wrapper's cache set-up)
        if self.owner.get(id(b)) != "prelude" or a.index() != b.index() or not _same_node(a_node, b_node):
            return False
        if not all(self._follows(x, y) for x, y in zip(a_node.inputs, b_node.inputs)):
            return False
        self.lifted.add(id(b))
        return True

    def write(self, total: int, input_names: list[str], output_names: list[str]) -> None:
        """Layers TRACED..total-1 after the template, the tail reading the last, the contract's I/O order."""
        self.inputs = {v.name: v for v in self.graph.inputs}
        self.outputs = {v.name: v for v in self.graph.outputs}
        template_values = {id(o) for n in self.body[self.template] for o in n.outputs}
        previous = {}  # id(template value) -> its copy in the layer before
        written = []
        for j in range(TRACED, total):
            current, made = {}, {}
            for n in self.body[self.template]:
                ins = []
                for value in n.inputs:
                    if value is not None and id(value) in template_values:
                        ins.append(current[id(value)])
                    elif value is not None and self.owner.get(id(value)) == self.proof:  # the layer before this one
                        ins.append(previous.get(id(self.shift[id(value)]), self.shift[id(value)]))
                    else:
                        ins.append(self._lift(value, j, made, written))
                written.append(self._copy(n, ins, j, current))
            previous = current
        self.graph.insert_after(self.body[self.template][-1], written)
        for n in self.tail:
            for index, value in enumerate(n.inputs):
                if value is not None and id(value) in previous:
                    n.replace_input_with(index, previous[id(value)])
        missing = [name for name in input_names if name not in self.inputs] + [
            name for name in output_names if name not in self.outputs
        ]
        if missing:
            raise NotStitchable(f"the written graph lacks {missing[:4]}")
        self.graph.inputs.clear()
        self.graph.inputs.extend(self.inputs[name] for name in input_names)
        self.graph.outputs.clear()
        self.graph.outputs.extend(self.outputs[name] for name in output_names)

    def _lift(self, value, j: int, made: dict, written: list):
        """Layer j's own version of a value the template layer reads from outside it."""
        import onnx_ir as ir
        from torch.onnx._internal.exporter._core import TorchTensor

        if value is None or id(value) not in self.lifted:
            return value
        if id(value) in made:
            return made[id(value)]
        name = self._renamed(value.name, j, frm=self.template)
        shape = value.shape.copy() if value.shape is not None else None
        if value.is_graph_input():
            lifted = self.inputs.setdefault(name, ir.Value(name=name, shape=shape, type=value.type))
        elif value.is_initializer():
            if name not in self.graph.initializers:
                if name not in self.tensors:
                    raise NotStitchable(f"no tensor {name} for layer {j}")
                self.graph.register_initializer(
                    ir.Value(
                        name=name, shape=shape, type=value.type, const_value=TorchTensor(self.tensors[name], name=name)
                    )
                )
            lifted = self.graph.initializers[name]
        else:
            node = value.producer()
            copy = self._copy(node, [self._lift(v, j, made, written) for v in node.inputs], j, made)
            written.append(copy)
            lifted = copy.outputs[value.index()]
        made[id(value)] = lifted
        return lifted

    def _copy(self, node, inputs: list, j: int, values: dict):
        """`node` for layer j, reading `inputs`; its outputs recorded in `values` (layer-j graph outputs named)."""
        import onnx_ir as ir

        copy = ir.Node(
            node.domain,
            node.op_type,
            inputs,
            list(node.attributes.values()),
            overload=node.overload,
            num_outputs=len(node.outputs),
            version=node.version,
            name=f"{node.name}_layer{j}",
            metadata_props=dict(node.metadata_props),
        )
        for old, new in zip(node.outputs, copy.outputs):
            new.name = f"{old.name}_layer{j}"
            new.type = old.type
            new.shape = old.shape.copy() if old.shape is not None else None
            values[id(old)] = new
            renamed = self._renamed(old.name, j, frm=self.template) if old.is_graph_output() else None
            if renamed:
                new.name = renamed
                self.outputs[renamed] = new
        return copy


def _same_node(a, b) -> bool:
    return (a.domain, a.op_type, a.overload, len(a.inputs), len(a.outputs)) == (
        b.domain,
        b.op_type,
        b.overload,
        len(b.inputs),
        len(b.outputs),
    ) and _attributes_equal(a, b)
