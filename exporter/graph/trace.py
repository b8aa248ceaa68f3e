"""Trace a causal LM's window forward to ONNX with the contract's names and dynamic axes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from jacobi_rt.runtime import spec

from ..attention.attention import grouped_attention_for
from ..limits import static_rope
from ..quiet import torchvision_notices_hidden
from ..weights import lazy_weights
from ..weights.weight_file import WeightFile
from . import graph_optimizer
from .norms import fusable_norms
from .stitch import TRACED, NotStitchable, decoder_layers, extend_layers, first_layers, layers_to_trace
from .window_model import WindowModel, output_cache

TWO_GB = 2 * 1024**3
# the wrappers (WindowModel, InplaceWindowModel) hold the model as `.model`: its parameters' names in the graph
WRAPPED = "model."


@dataclass
class ModelShape:
    """Architecture numbers read off a real forward pass, so they are right for every family."""

    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_positions: int


def probe(model) -> ModelShape:
    config = model.config
    with torch.no_grad():
        out = model(torch.zeros(1, 2, dtype=torch.long), use_cache=True)
    layer = output_cache(out).layers[0]
    return ModelShape(
        num_layers=len(output_cache(out).layers),
        num_heads=config.num_attention_heads,
        kv_heads=layer.keys.shape[1],
        head_dim=layer.keys.shape[3],
        hidden_size=config.hidden_size,
        vocab_size=out.logits.shape[-1],
        max_positions=config.max_position_embeddings,
    )


def sample_inputs(shape: ModelShape, dtype: torch.dtype, batch=2, window=3, past=4) -> tuple:
    """Example inputs for tracing; sizes are distinct so no axis is confused with another."""
    kv = torch.randn(batch, shape.kv_heads, past, shape.head_dim, dtype=dtype)
    return (
        torch.randint(0, shape.vocab_size, (batch, window)),
        torch.arange(past, past + window).repeat(batch, 1),
        torch.ones(batch, past + window, dtype=torch.long),
        torch.tril(torch.ones(window, window, dtype=torch.bool)).repeat(batch, 1, 1),
        *[kv.clone() for _ in range(2 * shape.num_layers)],
    )


def export_onnx(model, shape: ModelShape, path: Path, opset: int, weights: TracedWeights | None = None) -> str:
    """torch.onnx.export (dynamo) of the window graph, then name every dynamic axis per the contract.
    Returns how its layers were made (stitch.py)."""
    from torch.export import Dim

    dtype = next(model.parameters()).dtype

    def build(layers: int):
        batch, window, past = Dim("batch"), Dim("window"), Dim("past")
        dynamic_shapes = {
            "input_ids": {0: batch, 1: window},
            "position_ids": {0: batch, 1: window},
            "attention_mask": {0: batch, 1: Dim.AUTO},  # total = past + window; a sum is not accepted as a Dim
            "window_mask": {0: batch, 1: window, 2: window},
            "past": tuple({0: batch, 2: past} for _ in range(2 * layers)),
        }
        layer_shape = ModelShape(**{**asdict(shape), "num_layers": layers})
        return WindowModel(model, layers).eval(), sample_inputs(layer_shape, dtype), dynamic_shapes

    return trace_window_graph(
        build, model, grouped_attention_for, path, opset, shape.num_layers, spec.PORTABLE, weights=weights
    )


def trace_window_graph(
    build,
    model,
    attention,
    path: Path,
    opset: int,
    num_layers: int,
    variant: str,
    translation_table: dict | None = None,
    rewrite=None,
    weights: TracedWeights | None = None,
) -> str:
    """torch.onnx.export (dynamo) of a window graph with `attention` (a context manager) swapped into
    `model`, saved to `path` with the contract's names for `variant`; `rewrite(onnx_model)`, if given,
    edits the graph in the same load and save.

    build(layers) -> (wrapper, example inputs, dynamic shapes) of a graph with that many layers:
    the first stitch.TRACED layers are traced and the rest written as copies where the layers
    are alike (stitch.py), else all of them are traced. The weights go in by reference
    (lazy_weights.py) and are written by `weights` (None: the model's own, inside the graph file,
    or beside it past 2 GB). Returns how the layers were made, as a line for the log."""
    weights = weights or TracedWeights.own(model)
    traced, why = layers_to_trace(model, num_layers)
    program, rules = None, None
    with (
        warnings.catch_warnings(),
        torch.no_grad(),
        attention(model),
        fusable_norms(model),
        static_rope(model),
        torchvision_notices_hidden(),
    ):
        warnings.simplefilter("ignore")
        if traced < num_layers:
            try:
                program, rules = _traced_and_written(
                    build, model, traced, num_layers, opset, variant, translation_table, weights
                )
                how = f"traced {traced} of {num_layers} layers, wrote the other {num_layers - traced}"
            except NotStitchable as exc:
                why = str(exc)
        if program is None:
            program = _onnx_program(*build(num_layers), opset, num_layers, variant, translation_table, optimize=False)
            weights.bind(program.model)
            how = f"traced all {num_layers} layers" + (f" ({why})" if why and num_layers > TRACED else "")
    graph_optimizer.optimize(program.model, rules)  # what torch.onnx.export(optimize=True) runs (rules: stitch's)
    weights.save(program.model, path)
    name_axes(path, num_layers, variant, rewrite)
    return how


@dataclass
class TracedWeights:
    """Where a traced graph's weights come from (`read`: parameter name -> array) and go (`file`:
    the artifact's shared weights file; None: inside the graph file)."""

    read: lazy_weights.Read
    parameters: dict[str, str]  # initializer name in the traced graph -> parameter name
    file: WeightFile | None = None
    progress: Callable[[], None] | None = None  # ticked per tensor written

    @classmethod
    def of(cls, model, read: lazy_weights.Read, file: WeightFile | None = None, progress=None) -> TracedWeights:
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        return cls(read, {WRAPPED + n: n for n in names}, file, progress)

    @classmethod
    def own(cls, model) -> TracedWeights:
        from .skeleton import state_dict_reader

        return cls.of(model, state_dict_reader(model))

    def bind(self, onnx_model, fold: bool = True) -> None:
        """Every parameter initializer a lazy read; with `fold`, transposes of them folded the same way."""
        lazy_weights.bind(onnx_model, self.read, self.parameters)
        if fold:
            lazy_weights.fold_transposes(onnx_model)

    def save(self, onnx_model, path: Path) -> None:
        import onnx_ir as ir

        if self.file is not None:
            lazy_weights.externalize(onnx_model, self.file, self.progress)
            ir.save(onnx_model, str(path))
        elif _initializer_bytes(onnx_model) > TWO_GB:
            ir.save(onnx_model, str(path), external_data=path.name + ".data")
        else:
            ir.save(onnx_model, str(path))


def _initializer_bytes(onnx_model) -> int:
    return sum(v.const_value.nbytes for v in onnx_model.graph.initializers.values() if v.const_value is not None)


def _onnx_program(
    wrapper,
    inputs: tuple,
    dynamic_shapes: dict,
    opset: int,
    num_layers: int,
    variant: str,
    translation_table: dict | None,
    optimize: bool,
):
    return torch.onnx.export(
        wrapper,
        inputs,
        dynamo=True,
        opset_version=opset,
        dynamic_shapes=dynamic_shapes,
        custom_translation_table=translation_table,
        input_names=spec.input_names(num_layers, variant),
        output_names=spec.output_names(num_layers, variant),
        optimize=optimize,
        verbose=False,
    )


def _traced_and_written(
    build, model, traced: int, num_layers: int, opset: int, variant: str, translation_table, weights: TracedWeights
):
    """The first `traced` layers traced unoptimized, the rest written into the graph: (program, the
    rewrite rules that fire, found on the traced layers where it is cheap)."""
    with first_layers(model, traced):
        wrapper, inputs, dynamic_shapes = build(traced)
        program = _onnx_program(
            wrapper, inputs, dynamic_shapes, opset, traced, variant, translation_table, optimize=False
        )
    wrapped = f"{WRAPPED}{decoder_layers(model)[0]}."
    tensors = {WRAPPED + n: t for n, t in model.named_parameters(remove_duplicate=False)}
    tensors.update({WRAPPED + n: t for n, t in model.named_buffers(remove_duplicate=False)})
    weights.bind(program.model, fold=False)  # the stitch follows weights by their parameter names
    folded = program.model.clone()
    lazy_weights.fold_transposes(folded)
    rules = graph_optimizer.rules_that_fire(folded)
    extend_layers(
        program.model,
        wrapped,
        num_layers,
        tensors,
        spec.input_names(num_layers, variant),
        spec.output_names(num_layers, variant),
    )
    weights.bind(program.model)  # the written layers' own weights
    return program, rules


def name_axes(path: Path, num_layers: int, variant: str = spec.PORTABLE, rewrite=None) -> None:
    """Give every graph input/output dimension its contract name (the tracer invents some, e.g. 's53')."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if rewrite is not None:
        rewrite(model)
    wanted = {t.name: t.axes for t in spec.graph_inputs(num_layers, variant) + spec.graph_outputs(num_layers, variant)}
    for value in list(model.graph.input) + list(model.graph.output):
        for dim, axis in zip(value.type.tensor_type.shape.dim, wanted[value.name]):
            if axis in (spec.BATCH, spec.WINDOW, spec.PAST, spec.TOTAL, spec.CAPACITY):
                dim.ClearField("dim_value")
                dim.dim_param = axis
    onnx.save(model, str(path))
