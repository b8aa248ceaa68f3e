"""Which ONNX initializer each GGUF tensor feeds, found by content, and its blocks in graph order.

The traced graph's weights are transformers' dequantization of the GGUF, but under other names
(the tracer folds transposes into `val_63`-style constants) and, for Llama's q/k projections,
with rows reverse-permuted. So each candidate weight W [N, K] is matched to the GGUF tensor of
the same shape whose dequantized rows are W's rows in some order: rows are hashed exactly (their
float32 bits), the order found is applied to the quantized rows (a row of W is a row of
MatMulNBits), and the match is then verified bit for bit. Nothing depends on the loader's names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jacobi_rt.runtime.errors import ExportCheckError

from .blocks import BlockMatrix, UnsupportedType, from_gguf

FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@dataclass
class WeightPlan:
    """What the weight pass does to one graph: initializer -> blocks, and what stays float and why."""

    matrices: dict[str, BlockMatrix] = field(default_factory=dict)
    kept_float: dict[str, tuple[str, str]] = field(default_factory=dict)  # initializer -> (tensor type, why)
    padded_attention: int = 0  # GroupQueryAttention nodes given an extra query row (gqa_rows.py), level 4 only

    def tensor_types(self) -> dict[str, int]:
        return dict(Counter(m.kind for m in self.matrices.values()))

    def kept_types(self) -> dict[str, int]:
        return dict(Counter(kind for kind, _ in self.kept_float.values()))


@dataclass
class _Tensor:
    name: str
    kind: str
    raw: np.ndarray
    shape: tuple[int, int]  # (N, K)
    _values: np.ndarray | None = None
    _index: dict[int, int] | None = None
    _blocks: BlockMatrix | None = None

    def values(self) -> np.ndarray:
        """float32 [N, K] as the gguf package dequantizes it (what transformers loads)."""
        if self._values is None:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            self._values = dequantize(self.raw, GGMLQuantizationType[self.kind]).reshape(self.shape).astype(np.float32)
        return self._values

    def index(self) -> dict[int, int]:
        if self._index is None:
            self._index = {}
            for row, h in enumerate(row_hashes(self.values())):
                self._index.setdefault(int(h), row)
        return self._index

    def blocks(self) -> BlockMatrix:
        if self._blocks is None:
            self._blocks = from_gguf(self.kind, self.raw, *self.shape)
        return self._blocks


class GgufWeights:
    """The quantized 2-D tensors of a GGUF file, matched to a graph's weights by content."""

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        self.tensors: list[_Tensor] = []
        for t in reader.tensors:
            kind = t.tensor_type.name
            if len(t.shape) == 2 and kind not in FLOAT_TYPES:
                k, n = (int(x) for x in t.shape)  # GGUF lists ne0 (the contiguous K) first
                self.tensors.append(_Tensor(t.name, kind, np.asarray(t.data), (n, k)))
        self._cache: dict[tuple[str, bytes], BlockMatrix] = {}

    def plan(self, candidates: dict[str, np.ndarray]) -> WeightPlan:
        """candidates: initializer -> W [N, K] float32. Unmatched ones stay float, silently: they
        are float in the GGUF too (norms, biases) or not GGUF tensors at all."""
        plan = WeightPlan()
        for name, w in candidates.items():
            found = self._find(w)
            if found is None:
                continue
            tensor, rows = found
            try:
                blocks = self._blocks_in_order(tensor, rows)
            except UnsupportedType:
                plan.kept_float[name] = (tensor.kind, f"{tensor.name} is {tensor.kind}, which has no exact MatMulNBits form here: kept as float32")
                continue
            if not np.array_equal(blocks.dequantize().view(np.uint32), w.view(np.uint32)):
                raise ExportCheckError(
                    f"GGUF tensor {tensor.name} ({tensor.kind}) does not reproduce the traced weight {name} bit for bit; "
                    "export without weights='gguf' and report this"
                )
            plan.matrices[name] = blocks
        return plan

    def _find(self, w: np.ndarray) -> tuple[_Tensor, np.ndarray] | None:
        hashes = None
        for tensor in self.tensors:
            if tensor.shape != w.shape:
                continue
            hashes = row_hashes(w) if hashes is None else hashes
            index = tensor.index()
            if int(hashes[0]) not in index:
                continue
            try:
                rows = np.fromiter((index[int(h)] for h in hashes), dtype=np.int64, count=len(hashes))
            except KeyError:
                continue
            if np.array_equal(tensor.values()[rows].view(np.uint32), w.view(np.uint32)):
                return tensor, rows
        return None

    def _blocks_in_order(self, tensor: _Tensor, rows: np.ndarray) -> BlockMatrix:
        """The tensor's blocks with its rows in graph order; one object per (tensor, order), so a tied
        embedding and LM head share their quantized arrays."""
        identity = np.array_equal(rows, np.arange(len(rows)))
        key = (tensor.name, b"" if identity else rows.tobytes())
        if key not in self._cache:
            blocks = tensor.blocks()
            self._cache[key] = blocks if identity else blocks.take_rows(rows)
        return self._cache[key]


def row_hashes(w: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """An exact hash of each row's float32 bits (equal rows, equal hashes; -0.0 and 0.0 differ)."""
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    coeffs = np.random.default_rng(0).integers(1, 2**63, size=bits.shape[1], dtype=np.uint64) | np.uint64(1)
    out = np.empty(bits.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, bits.shape[0], chunk):
            part = bits[start : start + chunk].astype(np.uint64)
            out[start : start + chunk] = (part * coeffs).sum(axis=1)  # wraps modulo 2**64
    return out
