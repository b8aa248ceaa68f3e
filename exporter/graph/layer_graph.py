"""The window graph cut into stages that run alone: the embedding, each decoder layer, the tail.

    graph:   prelude ----------------------------> layer 0 -> layer 1 -> ... -> layer N-1 -> tail
             (embedding; masks, rotary tables,        ^ hidden in            hidden out ^   (norm, head,
              sizes: read by every layer)                                                    argmax)
    stage j: [ the prelude values layer j reads ] + [ layer j's nodes ], its hidden state a graph input

A stage is the backward closure of its outputs (the hidden state leaving, present.j.key/value;
the tail's logits and greedy ids), cut at the hidden state entering it, the graph's inputs and
its initializers. So a layer's stage holds that layer's weights and no other layer's.

Nodes belong to layer j by their module scope (`pkg.torch.onnx.name_scopes`, stitch.SCOPES) or,
for the layers stitch.py wrote (copies of a traced layer, scopes included), by their name's
`_layer{j}` suffix; a node the weight pass made (quantize.py) by those of the node it replaces,
which it carries. The hidden state is the one value that depends on `input_ids` (through data,
not shapes) and that layer j reads from outside itself.

A stage's graph is written into the graph's own folder under a temporary name, so that external
data resolves as it does for the graph (onnxruntime >= 1.24 refuses paths that leave the model's
folder), and is deleted once onnxruntime has read it.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jacobi_rt.runtime.errors import ExportCheckError, require

from ..weights.quantize import REPLACES
from .stitch import SCOPES

# a stage's float inputs as numpy makes them (bfloat16 has no numpy type: float32, cast by the caller)
ONNX_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": np.float32}
COPY_SUFFIX = re.compile(r"_layer(\d+)$")
SHAPE_OPS = {"Shape", "Size"}  # their outputs depend on shapes, never on values
EMBEDDING, PRELUDE, TAIL = "embedding", "prelude", "tail"


@dataclass
class Stage:
    name: str  # "embedding", "layer 3", "tail"
    hidden_in: str | None  # the value fed with the hidden state entering the stage (None: the embedding's)
    outputs: list[str]  # the hidden state leaving (the tail: logits, greedy_ids), then present.j.key/value
    nodes: list[int]  # indices into the graph's nodes, in graph order
    inputs: list[str]  # the graph inputs it reads
    initializers: list[str]
    carried: list[str] = field(default_factory=list)  # chained_stages: the values earlier stages compute that it reads


class LayerGraph:
    """The window graph at `path`, read without its external data, cut into stages."""

    def __init__(self, path: str | Path, num_layers: int, layer_scope: str):
        import onnx

        self.path = Path(path)
        self.model = onnx.load(str(self.path), load_external_data=False)
        self.num_layers = num_layers
        graph = self.model.graph
        self.nodes = list(graph.node)
        self.inputs = {v.name: v for v in graph.input}
        self.initializers = {t.name: t for t in graph.initializer}
        self.types = {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)}
        self.producer = {out: i for i, node in enumerate(self.nodes) for out in node.output if out}
        self.layer = _owners(self.nodes, [_layer_of(node, layer_scope) for node in self.nodes], self.producer)
        self._check_layers()
        self.dependent = self._dependent_on_ids()

    def stages(self) -> list[Stage]:
        """The embedding, layers 0..N-1, the tail, in the order they run."""
        hidden = [self._hidden_entering(j) for j in range(self.num_layers)] + [self._hidden_entering(TAIL)]
        stages = [self._stage(EMBEDDING, None, [hidden[0]])]
        for j in range(self.num_layers):
            stages.append(
                self._stage(f"layer {j}", hidden[j], [hidden[j + 1], f"present.{j}.key", f"present.{j}.value"])
            )
        stages.append(self._stage(TAIL, hidden[-1], ["logits", "greedy_ids"]))
        return stages

    def chained_stages(self) -> list[Stage]:
        """The same parts cut for running the graph in pieces (staged_run.py), not for comparing one
        hidden state with PyTorch's: a stage reads every input-dependent value an earlier stage computes
        (a norm fused across a layer boundary, skip_norms.py, makes two) and computes those a later one
        reads, beside its own graph outputs."""
        order = [PRELUDE, *range(self.num_layers), TAIL]
        rank = {owner: i for i, owner in enumerate(order)}
        stage_of = [rank.get(owner) for owner in self.layer]
        carried: list[dict[str, None]] = [{} for _ in order]  # per stage, the values it reads from earlier ones
        for i, node in enumerate(self.nodes):
            for value in _reads(node):
                made = stage_of[self.producer[value]] if value in self.producer else None
                if value in self.dependent and made is not None and stage_of[i] is not None and made != stage_of[i]:
                    carried[stage_of[i]][value] = None
        names = [EMBEDDING, *(f"layer {j}" for j in range(self.num_layers)), TAIL]
        own = [
            [],
            *([f"present.{j}.key", f"present.{j}.value"] for j in range(self.num_layers)),
            ["logits", "greedy_ids"],
        ]
        stages = []
        for s, (name, outputs) in enumerate(zip(names, own)):
            later = [v for reads in carried[s + 1 :] for v in reads if stage_of[self.producer[v]] == s]
            stages.append(self._cut(name, list(carried[s]), list(dict.fromkeys(outputs + later))))
        return stages

    def session(self, stage: Stage):
        """An onnxruntime CPU session of the stage alone (its weights only)."""
        ort = require("onnxruntime", 'pip install ".[cpu]" (or ".[gpu]") from the jacobi-rt checkout')

        part = self.path.parent / f".{self.path.stem}.{stage.name.replace(' ', '-')}.check-{os.getpid()}.onnx"
        try:
            self._write(stage, part)
            return ort.InferenceSession(str(part), providers=["CPUExecutionProvider"])
        finally:
            part.unlink(missing_ok=True)

    def initializer(self, name: str):
        return self.initializers[name]

    def _check_layers(self) -> None:
        found = sorted({k for k in self.layer if isinstance(k, int)})
        if found != list(range(self.num_layers)):
            raise ExportCheckError(
                f"{self.path}: cannot find the nodes of each of its {self.num_layers} layers by module scope "
                f"(found layers {found[:8]}...); the layer check needs a graph traced by this exporter"
            )

    def _dependent_on_ids(self) -> set[str]:
        """Values computed from input_ids' data (the hidden states, logits), not from its shape alone."""
        dependent = {"input_ids"}
        for node in self.nodes:
            if node.op_type not in SHAPE_OPS and any(name in dependent for name in _reads(node)):
                dependent.update(o for o in node.output if o)
        return dependent

    def _hidden_entering(self, layer) -> str:
        """The one input-dependent value that `layer` (an index or TAIL) reads from outside it."""
        found = []
        for node, owner in zip(self.nodes, self.layer):
            if owner != layer:
                continue
            for name in _reads(node):
                outside = name not in self.producer or self.layer[self.producer[name]] != layer
                if name in self.dependent and outside and name not in found:
                    found.append(name)
        if len(found) != 1:
            where = f"layer {layer}" if isinstance(layer, int) else "the tail"
            raise ExportCheckError(
                f"{self.path}: {where} reads {len(found)} hidden states from outside it ({found[:4]}), "
                "expected one; the layer check cannot cut this graph, run the whole-model check instead"
            )
        return found[0]

    def _stage(self, name: str, hidden_in: str | None, outputs: list[str]) -> Stage:
        missing = [o for o in outputs if o not in self.producer]
        if missing:
            raise ExportCheckError(f"{self.path}: {name}: no node computes {missing}")
        chosen, stack = set(), [self.producer[o] for o in outputs]
        while stack:
            i = stack.pop()
            if i in chosen:
                continue
            chosen.add(i)
            stack.extend(self.producer[v] for v in _reads(self.nodes[i]) if v != hidden_in and v in self.producer)
        read = {v for i in chosen for v in _reads(self.nodes[i])}
        if hidden_in is not None and "input_ids" in {
            v for i in chosen if self.nodes[i].op_type not in SHAPE_OPS for v in _reads(self.nodes[i])
        }:
            raise ExportCheckError(
                f"{self.path}: {name} recomputes the embedding: it reads a hidden state other than "
                f"{hidden_in}; the layer check cannot cut this graph, run the whole-model check instead"
            )
        return Stage(
            name,
            hidden_in,
            outputs,
            sorted(chosen),
            [v for v in self.inputs if v in read],
            [v for v in self.initializers if v in read],
        )

    def _cut(self, name: str, carried: list[str], outputs: list[str]) -> Stage:
        """The backward closure of `outputs`, stopped at `carried` (fed to it) and the graph's inputs."""
        chosen, stack, stops = set(), [self.producer[o] for o in outputs], set(carried)
        while stack:
            i = stack.pop()
            if i not in chosen:
                chosen.add(i)
                stack.extend(self.producer[v] for v in _reads(self.nodes[i]) if v not in stops and v in self.producer)
        read = {v for i in chosen for v in _reads(self.nodes[i])}
        return Stage(
            name,
            None,
            outputs,
            sorted(chosen),
            [v for v in self.inputs if v in read],
            [v for v in self.initializers if v in read],
            carried,
        )

    def _write(self, stage: Stage, path: Path) -> None:
        import onnx
        from onnx import helper

        fed = ([stage.hidden_in] if stage.hidden_in is not None else []) + stage.carried
        inputs = [self._value_info(v) for v in fed] + [self.inputs[v] for v in stage.inputs]
        graph = helper.make_graph(
            [self.nodes[i] for i in stage.nodes],
            stage.name,
            inputs,
            [self._value_info(o) for o in stage.outputs],
            initializer=[self.initializers[v] for v in stage.initializers],
        )
        part = helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        part.functions.extend(self.model.functions)
        onnx.save(part, str(path))

    def _value_info(self, name: str):
        from onnx import helper

        if name in self.types:
            return self.types[name]
        # an input-dependent value the graph leaves untyped (after contrib ops): a hidden state, in the logits' type
        return helper.make_tensor_value_info(name, self.types["logits"].type.tensor_type.elem_type, None)


def _owners(nodes: list, labels: list, producer: dict) -> list:
    """Each node's owner: PRELUDE before the first labelled node, TAIL after the last, else the
    later of its own layer and the layers that compute its inputs (a node the optimizer made has
    no scope, or its template's), or None: a value shared by the layers (sizes, constants)."""
    placed = [i for i, k in enumerate(labels) if k is not None]
    if not placed:
        return labels
    first, last = placed[0], placed[-1]
    owners = []
    for i, (node, label) in enumerate(zip(nodes, labels)):
        if i < first or i > last:
            owners.append(PRELUDE if i < first else TAIL)
            continue
        feeding = [owners[producer[v]] for v in _reads(node) if v in producer and producer[v] < i]
        layers = [k for k in feeding + [label] if isinstance(k, int)]
        owners.append(max(layers) if layers else None)
    return owners


def _layer_of(node, scope: str):
    """The decoder layer of a node (int), or None (prelude or tail: see LayerGraph)."""
    props = {entry.key: entry.value for entry in node.metadata_props}
    copy = COPY_SUFFIX.search(props.get(REPLACES, node.name))
    if copy:
        return int(copy.group(1))
    for name in ast.literal_eval(props.get(SCOPES, "[]")):
        if name.startswith(scope) and name[len(scope) :].isdigit():
            return int(name[len(scope) :])
    return None


def _reads(node) -> list[str]:
    """The values a node reads, those its subgraphs read from outside included."""
    names = [v for v in node.input if v]
    for attr in node.attribute:
        for graph in list(attr.g.node and [attr.g] or []) + list(attr.graphs):
            inner = (
                {o for n in graph.node for o in n.output}
                | {v.name for v in graph.input}
                | {t.name for t in graph.initializer}
            )
            names += [v for n in graph.node for v in _reads(n) if v not in inner]
    return names
