"""The window-graph contract (format v1), written once as data.

The exporter reads it to name inputs, outputs and dynamic axes; the engine builder reads it
to make optimization profiles; the runtime reads it to bind buffers. See docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT_VERSION = 1
MANIFEST_NAME = "jacobi.json"

BATCH, WINDOW, PAST, TOTAL = "batch", "window", "past", "total"
CAPACITY = "capacity"  # the in-place variant's fixed cache length

# Graph variants (the manifest's `graphs` maps variant -> file). PORTABLE: the past is concatenated
# into a new present every pass (any runtime, TensorRT). INPLACE: a fixed-capacity cache written in
# place by onnxruntime's GroupQueryAttention, a length per row (exporter/graph/inplace.py).
PORTABLE, INPLACE = "portable", "inplace"


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # "int64", "bool", "float32", or "model" (the model's KV dtype)
    axes: tuple[str, ...]  # symbolic names; fixed sizes are written as digits ("kv_heads" etc. are per-model)


def _kv(prefix: str, num_layers: int, length: str) -> list[Tensor]:
    """Layer by layer, the key then the value: `{prefix}.{i}.key` and `.value`, [batch, kv_heads, length, head_dim]."""
    return [
        Tensor(f"{prefix}.{i}.{kind}", "model", (BATCH, "kv_heads", length, "head_dim"))
        for i in range(num_layers)
        for kind in ("key", "value")
    ]


def kv_inputs(num_layers: int, variant: str = PORTABLE) -> list[Tensor]:
    return _kv("past_key_values", num_layers, CAPACITY if variant == INPLACE else PAST)


def kv_outputs(num_layers: int, variant: str = PORTABLE) -> list[Tensor]:
    return _kv(
        "present", num_layers, CAPACITY if variant == INPLACE else TOTAL
    )  # in place: the same buffer as the past


def graph_inputs(num_layers: int, variant: str = PORTABLE) -> list[Tensor]:
    # INPLACE: total = max(cache_lengths) + window; attention_mask covers the cached prefixes
    lengths = [Tensor("cache_lengths", "int64", (BATCH,))] if variant == INPLACE else []
    return [
        Tensor("input_ids", "int64", (BATCH, WINDOW)),
        Tensor("position_ids", "int64", (BATCH, WINDOW)),
        Tensor("attention_mask", "int64", (BATCH, TOTAL)),
        Tensor("window_mask", "bool", (BATCH, WINDOW, WINDOW)),
        *lengths,
        *kv_inputs(num_layers, variant),
    ]


def graph_outputs(num_layers: int, variant: str = PORTABLE) -> list[Tensor]:
    return [
        Tensor("logits", "float32", (BATCH, WINDOW, "vocab")),
        Tensor("greedy_ids", "int64", (BATCH, WINDOW)),
        *kv_outputs(num_layers, variant),
    ]


def input_names(num_layers: int, variant: str = PORTABLE) -> list[str]:
    return [t.name for t in graph_inputs(num_layers, variant)]


def output_names(num_layers: int, variant: str = PORTABLE) -> list[str]:
    return [t.name for t in graph_outputs(num_layers, variant)]
