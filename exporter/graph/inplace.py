"""The in-place window graph: a fixed-capacity KV cache that onnxruntime updates where the window lands.

Inputs (runtime/spec.py `inplace_inputs`): `input_ids`, `position_ids` [B, W]; `attention_mask`
[B, T] (1 = attend to that cached position; T = max(length) + W, so its shape carries T);
`window_mask` [B, W, W]; `cache_lengths` [B] int64, each row's committed entries; and
`past_key_values.{i}.key/value` [B, kv_heads, capacity, head_dim]. Outputs: `logits`,
`greedy_ids`, and `present.{i}.key/value` of the past's shape, which the runtime binds to the
same buffers as the past (exporter/attention/gqa.py, scatter_attention.py: the graph then writes in place).

The model's own forward runs with no cache object: its attention (registered with
transformers' AttentionInterface) receives the window's new keys and values after the model's
rotary, q/k norms or biases, and hands them to `jacobi::gqa` with the layer's past buffer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from jacobi_rt.runtime import spec

from ..attention import gqa as _gqa  # noqa: F401  (registers jacobi::gqa)
from ..attention.attention import attention_swapped
from ..attention.gqa import translation
from ..attention.gqa_layout import feed_gqa_3d
from ..attention.gqa_packed import pack_attention
from ..attention.gqa_rows import pad_attention_rows
from .rotary import fuse_rotary
from .skip_norms import fuse_skip_norms

NAME = "jacobi_inplace"
# the ONNX form of jacobi::gqa: "gqa" (the contrib op: reads only each row's length) or "scatter" (standard ops:
# reads the whole capacity)
ATTENTION = "gqa"
GRAPH_FILE = "model-inplace.onnx"


@dataclass
class InplaceWindow:
    """What every layer's attention needs for one pass, set on the attention modules for the pass."""

    past: tuple  # key0, value0, key1, value1, ...: [B, Hkv, C, D]
    seqlens_k: torch.Tensor  # [B] int32: length + W - 1
    total_len: torch.Tensor  # [] int32: T = max(length) + W
    presents: dict = field(default_factory=dict)  # layer -> (key, value)


def inplace_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    # query: [B, H, W, D]; key, value: [B, Hkv, W, D] (the window only: the model was given no cache)
    batch, heads, window, dim = query.shape
    kv_heads = key.shape[1]
    layer = module.layer_idx
    state: InplaceWindow = module.jacobi_window
    flat = lambda t: t.transpose(1, 2).reshape(batch, window, -1)  # noqa: E731  [B, W, heads*D]
    out, present_key, present_value = torch.ops.jacobi.gqa(
        flat(query),
        flat(key),
        flat(value),
        state.past[2 * layer],
        state.past[2 * layer + 1],
        state.seqlens_k,
        state.total_len,
        attention_mask,
        heads,
        kv_heads,
        float(scaling if scaling is not None else dim**-0.5),
        float(softcap or 0.0),
    )
    state.presents[layer] = (present_key, present_value)
    return out.view(batch, window, heads, dim), None


def window_bias(attention_mask, window_mask, lengths, dtype, width: int) -> torch.Tensor:
    """[B, T] int64, [B, W, W] bool, [B] int64 -> [B, 1, W, width] additive bias over absolute cache positions.

    Row b's prefix is [0, length_b) (masked by attention_mask), its window [length_b, length_b + W)
    (masked by window_mask); anything after is blocked. Built once per pass over the whole
    capacity (`width`), so every layer's attention shares it (the scatter form reads the capacity;
    the GroupQueryAttention form slices it to T).
    """
    window, total = window_mask.shape[-1], attention_mask.shape[-1]
    columns = torch.arange(width)
    rel = columns[None, :] - lengths[:, None]  # [B, C]: column - length_b
    in_window = (rel >= 0) & (rel < window)
    index = rel.clamp(0, window - 1)[:, None, :].expand(-1, window, -1)  # [B, W, C]
    inside = torch.gather(window_mask, 2, index) & in_window[:, None, :]
    padding = torch.gather(attention_mask, 1, columns.clamp(max=total - 1)[None, :].expand(attention_mask.shape[0], -1))
    prefix = ((rel < 0) & padding.bool())[:, None, :]  # [B, 1, C]
    allowed = (inside | prefix)[:, None]  # [B, 1, W, C]
    return torch.where(allowed, torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype))


class InplaceWindowModel(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, num_layers: int):
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, position_ids, attention_mask, window_mask, cache_lengths, *past):
        dtype = past[0].dtype
        window, total = input_ids.shape[1], attention_mask.shape[1]
        state = InplaceWindow(
            past=past,
            seqlens_k=(cache_lengths + window - 1).to(torch.int32),
            total_len=torch.full((), total, dtype=torch.int32),
        )
        # on the attention modules, not through the forward's kwargs: some families' layers (StableLM) drop them
        layers = [m for m in self.model.modules() if hasattr(m, "layer_idx")]
        for module in layers:
            module.jacobi_window = state
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=window_bias(attention_mask, window_mask, cache_lengths, dtype, past[0].shape[2]),
                use_cache=False,
            )
        finally:
            for module in layers:
                del module.jacobi_window
        logits = out.logits.float()  # [B, W, vocab]
        present = [t for i in range(self.num_layers) for t in state.presents[i]]
        return (logits, logits.argmax(dim=-1), *present)


def inplace_attention_for(model):
    """Switch `model` to the in-place attention for the duration of a trace; restore eager on exit."""
    return attention_swapped(model, NAME, inplace_attention)


def unsupported(shape) -> str | None:
    """Why the in-place attention cannot serve this model (None when it can)."""
    if shape.num_heads % shape.kv_heads:
        return f"{shape.num_heads} query heads are not a multiple of {shape.kv_heads} KV heads"
    return None


def attention_form(shape) -> str:
    """The gqa form where onnxruntime's GroupQueryAttention takes the head size (a multiple of 16 on
    the CPU: "head_size shall be a multiple of 16"), else the scatter form, which takes any."""
    return ATTENTION if shape.head_dim % 16 == 0 else "scatter"


def sample_inputs(shape, dtype, batch=2, window=3, lengths=(1, 4), capacity=11) -> tuple:
    """Tracing inputs; batch, window, total (= 7) and capacity all differ so no axis is confused."""
    total = max(lengths) + window
    kv = torch.randn(batch, shape.kv_heads, capacity, shape.head_dim, dtype=dtype)
    return (
        torch.randint(0, shape.vocab_size, (batch, window)),
        torch.tensor(lengths)[:, None] + torch.arange(window),
        torch.ones(batch, total, dtype=torch.long),
        torch.tril(torch.ones(window, window, dtype=torch.bool)).repeat(batch, 1, 1),
        torch.tensor(lengths, dtype=torch.long),
        *[kv.clone() for _ in range(2 * shape.num_layers)],
    )


def export_inplace_onnx(
    model, shape, path: Path, opset: int, attention: str = ATTENTION, weights=None, extra_row: bool = True
) -> str:
    """torch.onnx.export (dynamo) of the in-place window graph, then the contract's axis names.
    extra_row: the gqa form's attention gets gqa_rows.py's extra query row. Returns how its layers were made
    (stitch.py)."""
    from dataclasses import asdict

    from torch.export import Dim

    from .trace import trace_window_graph

    dtype = next(model.parameters()).dtype

    def build(layers: int):
        batch, window, capacity = Dim("batch"), Dim("window"), Dim("capacity")
        dynamic_shapes = {
            "input_ids": {0: batch, 1: window},
            "position_ids": {0: batch, 1: window},
            "attention_mask": {0: batch, 1: Dim.AUTO},  # total = max(length) + window
            "window_mask": {0: batch, 1: window, 2: window},
            "cache_lengths": {0: batch},
            "past": tuple({0: batch, 2: capacity} for _ in range(2 * layers)),
        }
        layer_shape = type(shape)(**{**asdict(shape), "num_layers": layers})
        return InplaceWindowModel(model, layers).eval(), sample_inputs(layer_shape, dtype), dynamic_shapes

    # onnxruntime-only already (the contrib op): skip norms, rotary, GQA's own layout too; the scatter form stays
    # standard ONNX
    return trace_window_graph(
        build,
        model,
        inplace_attention_for,
        path,
        opset,
        shape.num_layers,
        spec.INPLACE,
        translation(attention),
        partial(onnxruntime_fusions, max_positions=shape.max_positions, extra_row=extra_row)
        if attention == "gqa"
        else None,
        weights,
    )


def onnxruntime_fusions(onnx_model, max_positions: int, extra_row: bool) -> None:
    """The contrib-op rewrites of the gqa form, in the trace's own load and save (so its check covers them)."""
    fuse_skip_norms(onnx_model)
    fuse_rotary(onnx_model, max_positions)
    feed_gqa_3d(onnx_model)
    pack_attention(onnx_model)
    if extra_row:
        pad_attention_rows(onnx_model)


def add_inplace_graph(
    model,
    shape,
    folder: Path,
    dtype: str,
    opset: int,
    step,
    check_progress=None,
    max_context: int | None = None,
    weights=None,
    portable: Path | None = None,
    weights_in=contextlib.nullcontext,
    extra_row: bool = True,
) -> tuple[dict, dict]:
    """Export and check the in-place graph in `folder`: ({"inplace": file}, check figures with the
    attention form), or ({}, {"skipped": why}) when this family cannot map onto it (the artifact
    then has the portable graph only). A graph that traces but disagrees with its reference raises.
    The reference is PyTorch (the model holds its weights), or `portable`, the portable graph's file
    when it was checked layer by layer (a model too big for the whole check): both run stage by stage.
    weights_in: as check.check_against_torch's (the default: the model holds its weights).
    extra_row: the attention gets gqa_rows.py's extra query row (gqa_rows.wanted says for which weights).

    check_progress(n): as export()'s, called when the check starts (a bar made before the trace
    would count the trace's minutes as the first shape's)."""
    from jacobi_rt.runtime.errors import JacobiError

    reason, attention = unsupported(shape), attention_form(shape)
    path = folder / GRAPH_FILE
    if reason is None:
        step(f"tracing the in-place graph ({attention} attention, opset {opset})")
        try:
            step(f"  {export_inplace_onnx(model, shape, path, opset, attention, weights, extra_row)}")
        except JacobiError:
            raise
        except Exception as exc:  # torch.export / onnxscript raise many types for an architecture they cannot trace
            reason = f"tracing failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if reason is not None:
        for p in folder.glob(GRAPH_FILE + "*"):
            p.unlink()
        step(f"no in-place graph for this model: {reason}")
        return {}, {"skipped": reason}
    report = _check(model, shape, path, dtype, portable, step, check_progress, max_context, weights_in)
    extra_row = extra_row and attention == "gqa"  # the scatter form has no GroupQueryAttention to pad
    return {spec.INPLACE: GRAPH_FILE}, {**report.to_dict(), "attention": attention, "extra_row": extra_row}


def _check(
    model,
    shape,
    path: Path,
    dtype: str,
    portable: Path | None,
    step,
    check_progress,
    max_context: int | None,
    weights_in,
):
    """The in-place graph against the portable ONNX (`portable`), or against PyTorch, its graph run
    whole or stage by stage as the model's size says (budget.staged)."""
    from ..checks.inplace_check import CASES, check_inplace_against_portable, check_inplace_against_torch
    from ..checks.layer_check import layer_scope, staged_scope
    from ..checks.staged_run import ticks

    scope = layer_scope(model) if portable is not None else staged_scope(model)
    against = "the portable one" if portable is not None else "PyTorch"
    step(f"checking the in-place graph against {against} at {len(CASES)} batches{', stage by stage' if scope else ''}")
    if portable is not None:
        progress = check_progress(2 * ticks(len(CASES), shape.num_layers, True)) if check_progress else None
        return check_inplace_against_portable(portable, path, shape, dtype, scope, progress, max_context=max_context)
    progress = check_progress(ticks(len(CASES), shape.num_layers, scope is not None)) if check_progress else None
    return check_inplace_against_torch(
        model, shape, path, dtype, progress, max_context=max_context, layer_scope=scope, weights_in=weights_in
    )
