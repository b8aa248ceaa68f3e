"""The random values of a random model's tensors, drawn chunk by chunk, the same whatever the chunking.

Tensor `index` of a model made with `seed` draws from its own generator (`default_rng([seed, index])`),
so the safetensors shards (written in chunks) and a GGUF of the same model (one tensor at a time) hold
the same values, and one tensor can be drawn again without the others. Linear weights, embeddings
and biases are normal(0, std) (std: the config's initializer_range, as an initializer would draw them);
norm weights are 1.0.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .random_shapes import TensorSpec

CHUNK = 1 << 23  # values drawn at a time: 32 MB of float32
BIAS_STD = 0.02


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def value_chunks(spec: TensorSpec, index: int, seed: int, std: float, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """The tensor's values, flattened, as float32 chunks of at most `chunk` values."""
    total = _count(spec.shape)
    if spec.kind == "norm":
        for start in range(0, total, chunk):
            yield np.ones(min(chunk, total - start), np.float32)
        return
    rng = np.random.default_rng([seed, index])
    scale = np.float32(BIAS_STD if spec.kind == "bias" else std)
    for start in range(0, total, chunk):
        values = rng.standard_normal(min(chunk, total - start), dtype=np.float32)
        values *= scale
        yield values


def tensor_values(spec: TensorSpec, index: int, seed: int, std: float) -> np.ndarray:
    """The whole tensor (float32, its shape): the concatenated `value_chunks`."""
    out = np.empty(_count(spec.shape), np.float32)
    at = 0
    for values in value_chunks(spec, index, seed, std):
        out[at : at + values.size] = values
        at += values.size
    return out.reshape(spec.shape)


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even) as uint16 bits: the upper half of the float32."""
    bits = values.view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the file's dtype ("bf16", "fp16", "fp32"), ready to write as raw bytes."""
    if dtype == "bf16":
        return to_bfloat16_bits(values)
    if dtype == "fp16":
        return values.astype(np.float16)
    return values
