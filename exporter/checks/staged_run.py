"""A window graph run whole, or in pieces: its stages (layer_graph.chained_stages: the embedding, each
decoder layer, the tail) one after another, one stage's weights resident at a time, every case through
a stage before the next one loads. The outputs are the whole graph's (the same nodes, chained).

Staged is for what must run a graph beside a model too big to hold twice, as the export's checks do
past budget.STAGED_ABOVE of weights: the PyTorch model whole (check.py, inplace_check.py), or a
quantized graph against a float graph of 30 GB (check.check_against_onnx).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jacobi_rt.runtime.errors import require
from jacobi_rt.runtime.spec import kv_inputs

from ..graph.layer_graph import ONNX_FLOATS, LayerGraph
from ..graph.trace import ModelShape

ORT_HINT = (
    'pip install ".[cpu]" (or ".[gpu]") from the jacobi-rt checkout: the export check runs the graph in onnxruntime'
)

GRAPH_OUTPUTS = ("logits", "greedy_ids")  # beside present.<layer>.key/value


@dataclass
class Run:
    """One window: its feeds (input_ids, position_ids, attention_mask, window_mask, numpy) over a past
    that is given (`past`: layer -> (key, value)), computed by the graph itself over `prefill` (the
    past tokens as one window), or empty."""

    feeds: dict
    prefill: Run | None = None
    past: dict = field(default_factory=dict)
    carried: dict = field(default_factory=dict)  # values between stages
    outputs: dict = field(default_factory=dict)  # the graph's outputs by name, once run

    def past_of(self, layer: int, shape: ModelShape, dtype=np.float32) -> tuple:
        """Layer's (key, value) past: the given one, the prefill's presents, or an empty one."""
        if layer in self.past:
            return self.past[layer]
        if self.prefill is not None:
            return self.prefill.outputs[f"present.{layer}.key"], self.prefill.outputs[f"present.{layer}.value"]
        empty = np.zeros((self.feeds["input_ids"].shape[0], shape.kv_heads, 0, shape.head_dim), dtype=dtype)
        return empty, empty

    def ordered(self, names: list[str]) -> list:
        return [self.outputs[name] for name in names]


def run_graph(path, shape: ModelShape, runs: list[Run], layer_scope: str | None = None, progress=None) -> list[str]:
    """Every run through the graph at `path`: one whole session, or with `layer_scope` (the decoder
    layers' module scope, e.g. "model.model.layers.") stage by stage. progress: ticked per run (whole)
    or per stage (staged; see ticks). Returns the graph's output names, in order."""
    if layer_scope is not None:
        return run_staged(path, shape, layer_scope, runs, progress)
    ort = require("onnxruntime", ORT_HINT)

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    past_names = [t.name for t in kv_inputs(shape.num_layers)]
    for run in runs:
        for part in ([run.prefill] if run.prefill is not None else []) + [run]:
            past = [part.past_of(j, shape)[v] for j in range(shape.num_layers) for v in (0, 1)]
            part.outputs = dict(zip(names, session.run(names, {**part.feeds, **dict(zip(past_names, past))})))
        if progress:
            progress()
    return names


def ticks(runs: int, num_layers: int, staged: bool) -> int:
    """How often run_graph ticks its progress: per stage when staged, else per run."""
    return num_layers + 2 if staged else runs


def run_staged(graph_path, shape: ModelShape, layer_scope: str, runs: list[Run], progress=None) -> list[str]:
    """Run every run through the graph at `graph_path`, stage by stage (progress: ticked per stage);
    returns the graph's output names, in order."""
    graph = LayerGraph(graph_path, shape.num_layers, layer_scope)
    for stage in graph.chained_stages():
        session = graph.session(stage)
        layer = int(stage.name.split()[1]) if stage.name.startswith("layer ") else None
        for run in runs:
            if run.prefill is not None:
                _step(session, run.prefill, layer, shape)
            _step(session, run, layer, shape)
        del session
        if progress:
            progress()
    return [o.name for o in graph.model.graph.output]


def _step(session, run: Run, layer: int | None, shape: ModelShape) -> None:
    feeds = {}
    for arg in session.get_inputs():
        if arg.name in run.carried:
            feeds[arg.name] = run.carried[arg.name]
        elif arg.name.startswith("past_key_values."):  # this layer's past: another layer's is read for its shape only
            feeds[arg.name] = run.past_of(layer or 0, shape, ONNX_FLOATS[arg.type])[arg.name.endswith(".value")]
        else:
            feeds[arg.name] = run.feeds[arg.name]
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names, session.run(names, feeds)):
        run.carried[name] = value
        if name in GRAPH_OUTPUTS or name.startswith("present."):
            run.outputs[name] = value
