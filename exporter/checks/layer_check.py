"""The export check layer by layer: for models too big to run whole, in PyTorch or in onnxruntime.

Each stage of the ONNX graph (layer_graph.py: the embedding, every decoder layer, the tail) runs
alone in onnxruntime against the same stage of the PyTorch model, one layer's weights resident
on each side at a time (`read_layer(j)` brings layer j's parameters in and frees them after).
The cases are check.py's (SHAPES: window 1 / past 0, a left-padded row, two-branch windows) on
the same random tokens; the past of each layer comes from a real PyTorch forward over them,
layer by layer.

Two runs of each ONNX stage per case:
- isolated: fed PyTorch's hidden state, so that errors do not compound and a wrong layer is
  named (per-stage max |hidden diff| and |present diff|);
- chained: fed the ONNX stage before it, as the whole graph runs, so that the final logits and
  greedy ids are what check.check_against_torch compares (the same inputs, the same figures).

A PyTorch decoder layer runs through the model's own forward with its layer list cut to that one
layer (the masks, rotary tables and per-family scalings stay the model's): a forward pre-hook swaps
in the hidden state, a forward hook takes the layer's output and stops the pass before the head.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from jacobi_rt.runtime.errors import ExportCheckError

from ..graph.layer_graph import EMBEDDING, ONNX_FLOATS, TAIL, LayerGraph
from ..graph.stitch import decoder_layers
from ..graph.trace import WRAPPED, ModelShape
from ..graph.window_model import CACHE_ARG, additive_mask
from .check import SHAPES, TOLERANCE, CheckReport, _compare, case_tensors, fitted

# A layer's hidden state against PyTorch's, relative to the largest |value| of PyTorch's (the
# residual stream grows through the layers: SmolLM2-135M's reaches ~1e2 with fp32 errors ~1e-5).
HIDDEN_TOLERANCE = {"float32": 1e-4, "float16": 2e-2}


@dataclass
class StageFigures:
    stage: str  # "embedding", "layer 3", "tail"
    max_hidden_diff: float  # isolated: fed PyTorch's hidden state (the tail: its logits)
    max_present_diff: float  # isolated
    max_abs: float  # the largest |value| of PyTorch's output, what the hidden tolerance scales with
    seconds: float  # weights in, session, runs

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if k == "seconds" else v) for k, v in self.__dict__.items()}


@dataclass
class LayerCheckReport(CheckReport):
    """check.CheckReport's end-to-end figures (chained through the stages) plus each stage's."""

    method: str = "layer by layer"
    hidden_tolerance: float = 0.0
    stages: list = field(default_factory=list)  # StageFigures.to_dict() of each stage, in order

    def worst(self) -> dict | None:
        """The first stage out of tolerance, or None."""
        for figures in self.stages:
            limit = self.tolerance if figures["stage"] == TAIL else self.hidden_tolerance * max(1.0, figures["max_abs"])
            if figures["max_hidden_diff"] > limit or figures["max_present_diff"] > limit:
                return figures
        return None


@dataclass
class _Case:
    """One check case (check.case_tensors: random_case's inputs without the past) and its state between layers."""

    shape: tuple  # (batch, window, past)
    ids: torch.Tensor  # [B, P + W]
    mask: torch.Tensor  # [B, P + W]
    window_mask: torch.Tensor  # [B, W, W]
    positions: torch.Tensor  # [B, W]
    past_hidden: torch.Tensor | None = None  # PyTorch's hidden state over the past tokens, entering the next layer
    hidden: torch.Tensor | None = None  # PyTorch's over the window
    chained: np.ndarray | None = None  # the ONNX stages' over the window
    logits: np.ndarray | None = None  # PyTorch's


def check_layers(
    graph_path, model, shape: ModelShape, dtype: str, read_layer=None, progress=None, max_context: int | None = None
) -> LayerCheckReport:
    """Compare the portable ONNX graph with PyTorch stage by stage; raise ExportCheckError naming the
    first stage out of tolerance, or if the chained logits or greedy ids disagree (as check.py).

    model: the causal LM, its decoder layers possibly on the meta device; read_layer(j): a context
    manager within which layer j's parameters are real (None: they always are). progress: ticked once
    per stage (stage_count(shape.num_layers) of them). max_context: the exported context."""
    graph = LayerGraph(graph_path, shape.num_layers, layer_scope(model))
    stages = graph.stages()
    cases = [_case(shape, b, w, p, seed) for seed, (b, w, p) in enumerate(fitted(SHAPES, max_context))]
    report = LayerCheckReport(tolerance=TOLERANCE[dtype], hidden_tolerance=HIDDEN_TOLERANCE[dtype])
    done: list[StageFigures] = []
    for stage in stages:
        started = time.perf_counter()
        figures = StageFigures(stage.name, 0.0, 0.0, 0.0, 0.0)
        if stage.name == EMBEDDING:
            _embedding(graph.session(stage), cases)
        elif stage.name == TAIL:
            _tail(graph.session(stage), cases, figures, report)
        else:
            j = int(stage.name.split()[1])
            with read_layer(j) if read_layer else contextlib.nullcontext():
                _layer(graph.session(stage), model, shape, j, cases, figures, report, done[0] if j == 0 else None)
        figures.seconds = time.perf_counter() - started
        done.append(figures)
        if progress:
            progress()
    report.stages = [f.to_dict() for f in done]
    _verdict(report, graph_path)
    return report


def stage_count(num_layers: int) -> int:
    """The stages check_layers ticks progress for: the embedding, each layer, the tail."""
    return num_layers + 2


def layer_scope(model) -> str:
    """The module scope of the decoder layers in the traced graph, e.g. "model.model.layers."."""
    return f"{WRAPPED}{_layers(model)[0]}."


def staged_scope(model) -> str | None:
    """The layer scope for running a check's ONNX graphs stage by stage when the model is big enough
    (budget.staged), else None: whole sessions."""
    from ..budget import staged, weight_bytes

    return layer_scope(model) if staged(weight_bytes(model)) else None


def _layers(model):
    found = decoder_layers(model)
    if found is None:
        raise ExportCheckError(
            f"{type(model).__name__}: no ModuleList of num_hidden_layers alike decoder layers; "
            "the layer check needs one, run the whole-model check instead"
        )
    return found


def _case(shape: ModelShape, batch: int, window: int, past: int, seed: int) -> _Case:
    return _Case((batch, window, past), *case_tensors(shape.vocab_size, batch, window, past, seed))


def _feeds(session, case: _Case, hidden=None, past: tuple | None = None) -> dict:
    """A stage's inputs. Every past input gets this layer's past: a stage reads its own layer's by
    value and, at most, another layer's by its shape (the sizes the first layer computes), alike."""
    batch, window, length = case.shape
    values = {
        "input_ids": case.ids[:, length:],
        "position_ids": case.positions,
        "attention_mask": case.mask,
        "window_mask": case.window_mask,
    }
    feeds = {}
    for i, arg in enumerate(session.get_inputs()):
        if i == 0 and hidden is not None:
            feeds[arg.name] = np.asarray(hidden, dtype=ONNX_FLOATS[arg.type])
        elif arg.name.startswith("past_key_values."):
            feeds[arg.name] = past[arg.name.endswith(".value")].numpy()
        else:
            feeds[arg.name] = values[arg.name].numpy()
    return feeds


def _max_diff(a, b) -> float:
    if isinstance(b, torch.Tensor):
        b = b.float().numpy()
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max()) if np.size(a) else 0.0


def _embedding(session, cases: list[_Case]) -> None:
    """The ONNX embedding starts each case's chain; layer 0's stage compares it with PyTorch's."""
    for case in cases:
        case.chained = session.run(None, _feeds(session, case))[0]


def _layer(
    session,
    model,
    shape: ModelShape,
    j: int,
    cases: list[_Case],
    figures: StageFigures,
    report,
    embedding: StageFigures | None,
) -> None:
    last = j == shape.num_layers - 1
    with torch.no_grad(), _one_layer(model, j) as layer:
        for case in cases:
            past = _past(model, layer, shape, j, case)
            entering, hidden, present, logits = _window(model, layer, j, case, past, last)
            if embedding is not None:  # PyTorch's embedding, taken as layer 0 starts
                case.hidden = entering
                _account(embedding, case.chained, entering)
            isolated = session.run(None, _feeds(session, case, case.hidden.float().numpy(), past))
            chained = session.run(None, _feeds(session, case, case.chained, past))
            _account(figures, isolated[0], hidden, zip(isolated[1:], present))
            report.max_present_diff = max(
                report.max_present_diff, *(_max_diff(o, p) for o, p in zip(chained[1:], present))
            )
            case.hidden, case.chained = hidden, chained[0]
            if last:
                case.logits = logits


def _tail(session, cases: list[_Case], figures: StageFigures, report: LayerCheckReport) -> None:
    for case in cases:
        isolated = session.run(None, _feeds(session, case, case.hidden.float().numpy()))
        chained = session.run(None, _feeds(session, case, case.chained))
        _account(figures, isolated[0], case.logits)
        _compare(report, [case.logits, case.logits.argmax(-1)], chained, case.shape)


def _account(figures: StageFigures, got, expected, presents=()) -> None:
    expected = np.asarray(expected.float() if isinstance(expected, torch.Tensor) else expected)
    figures.max_hidden_diff = max(figures.max_hidden_diff, _max_diff(got, expected))
    figures.max_abs = max(figures.max_abs, float(np.abs(expected).max()) if expected.size else 0.0)
    for o, p in presents:
        figures.max_present_diff = max(figures.max_present_diff, _max_diff(o, p.float()))


def _past(model, layer, shape: ModelShape, j: int, case: _Case) -> tuple:
    """Layer j's past (keys, values) from a PyTorch forward over the case's past tokens; the past's
    hidden state moves on to the next layer."""
    batch, window, length = case.shape
    dtype = model.get_input_embeddings().weight.dtype
    if not length:
        empty = torch.zeros(batch, shape.kv_heads, 0, shape.head_dim, dtype=dtype)
        return empty, empty
    cache = DynamicCache(config=model.config)
    entering, case.past_hidden, _ = _run(
        model,
        layer,
        case.past_hidden,
        case.ids[:, :length],
        attention_mask=case.mask[:, :length],
        use_cache=True,
        **{CACHE_ARG: cache},
    )
    return cache.layers[j].keys, cache.layers[j].values


def _window(model, layer, j: int, case: _Case, past: tuple, last: bool):
    """PyTorch's layer j over the window: (hidden entering, hidden leaving, (present keys, values), logits of
    the last layer)."""
    batch, window, length = case.shape
    cache = DynamicCache()
    for i in range(j + 1):  # the layers before j hold the same past: the model reads the past length off layer 0
        cache.update(past[0], past[1], i)
    entering, hidden, out = _run(
        model,
        layer,
        case.hidden,
        case.ids[:, length:],
        position_ids=case.positions,
        attention_mask=additive_mask(case.mask, case.window_mask, past[0].dtype),
        use_cache=True,
        stop=not last,
        **{CACHE_ARG: cache},
    )
    logits = out.logits.float().numpy() if last else None
    return entering, hidden, (cache.layers[j].keys, cache.layers[j].values), logits


class _Stop(Exception):
    """Raised by the forward hook: the layer's output is taken, the head need not run."""


def _run(model, layer, hidden, input_ids, stop: bool = True, **kwargs):
    """The model's forward with `hidden` (None: the model's own embedding) entering `layer`, its one
    layer: (hidden entering, hidden leaving, the model's output unless stopped)."""
    seen = {}

    def enter(module, args, kw):
        given = args[0] if args else kw["hidden_states"]
        seen["in"] = given if hidden is None else hidden.to(given.dtype)
        if hidden is None:
            return None
        return ((seen["in"], *args[1:]), kw) if args else (args, {**kw, "hidden_states": seen["in"]})

    def leave(module, args, output):
        seen["out"] = output[0] if isinstance(output, tuple) else output
        if stop:
            raise _Stop

    handles = [layer.register_forward_pre_hook(enter, with_kwargs=True), layer.register_forward_hook(leave)]
    out = None
    try:
        out = model(input_ids=input_ids, **kwargs)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return seen["in"], seen["out"], out


@contextlib.contextmanager
def _one_layer(model, j: int):
    """Within the block the model's decoder is its layer j alone (its index kept, so that it reads
    and writes cache layer j); config.layer_types names layer j's type for every index."""
    name, layers = _layers(model)
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    attribute = name.rpartition(".")[2]
    types = getattr(model.config, "layer_types", None)
    setattr(parent, attribute, torch.nn.ModuleList([layers[j]]))
    if isinstance(types, list):
        model.config.layer_types = [types[j]] * len(types)
    try:
        yield layers[j]
    finally:
        setattr(parent, attribute, layers)
        if isinstance(types, list):
            model.config.layer_types = types


def _verdict(report: LayerCheckReport, graph_path) -> None:
    worst = report.worst()
    if worst is not None:
        limit = report.tolerance if worst["stage"] == TAIL else report.hidden_tolerance * max(1.0, worst["max_abs"])
        raise ExportCheckError(
            f"{graph_path}: ONNX disagrees with PyTorch in {worst['stage']}: "
            f"max |hidden diff| {worst['max_hidden_diff']:.3g}, "
            f"max |present diff| {worst['max_present_diff']:.3g} (tolerance {limit:.3g}, fed PyTorch's hidden state); "
            "this is an exporter bug for this model: please report it"
        )
    if report.max_logit_diff > report.tolerance or report.greedy_agree + report.near_ties < report.positions:
        raise ExportCheckError(
            f"{graph_path}: every stage is within tolerance but the whole graph disagrees with PyTorch: "
            "max |logit diff| "
            f"{report.max_logit_diff:.3g} (tolerance {report.tolerance:g}), greedy ids agree on {report.greedy_agree}/"
            f"{report.positions} positions ({report.near_ties} near-ties); the errors compound: please report it"
        )


def streamed_layers(model, read):
    """read_layer for check_layers over a model whose decoder layers hold no data (a skeleton's
    placeholders, or the meta device): within read_layer(j), layer j's parameters hold what
    read(name) gives (skeleton.Read: its state-dict name, e.g. "model.layers.3.mlp.up_proj.weight",
    -> an array in the model's dtype); its own parameters again on exit. The parameters are swapped,
    not written into (`skeleton.filled`), since a meta tensor cannot take CPU data."""
    name, layers = _layers(model)

    @contextlib.contextmanager
    def read_layer(j: int):
        owners = [
            (m, attribute, p) for m in layers[j].modules() for attribute, p in m._parameters.items() if p is not None
        ]
        names = {id(p): f"{name}.{j}.{n}" for n, p in layers[j].named_parameters()}
        try:
            for module, attribute, p in owners:
                value = torch.from_numpy(np.array(read(names[id(p)]))).to(p.dtype)
                module._parameters[attribute] = torch.nn.Parameter(value, requires_grad=False)
            yield
        finally:
            for module, attribute, p in owners:
                module._parameters[attribute] = p

    return read_layer


def outside_layers(model) -> list[str]:
    """The parameters check_layers needs resident throughout (the embedding, the final norm, the head):
    every one that is not in a decoder layer."""
    name, _ = _layers(model)
    return [n for n, _ in model.named_parameters() if not n.startswith(f"{name}.")]
