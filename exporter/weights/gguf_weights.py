"""Which ONNX initializer each GGUF tensor feeds, found by content, and its blocks in graph order.

The traced graph's weights are transformers' dequantization of the GGUF, but under other names
(the tracer folds transposes into `val_63`-style constants) and, for Llama's q/k projections,
with rows reverse-permuted. So each candidate weight W [N, K] is matched to the GGUF tensor of
the same shape whose dequantized rows are W's rows in some order: rows are hashed exactly (their
float32 bits), the order found is applied to the quantized rows (a row of W is a row of
MatMulNBits), and the match is then verified bit for bit. Nothing depends on the loader's names.

Memory stays at a few tensors: each GGUF tensor is dequantized once, a chunk of rows at a time,
to keep only its row hashes (8 bytes a row) and their sum, a signature of the multiset of rows
that a row permutation keeps; a candidate is hashed, looked up by shape and signature (one
dictionary look-up, so the cost is linear in the tensors), and its blocks are made again, from
the mapped GGUF bytes, when the pass writes them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jacobi_rt.runtime.errors import ExportCheckError

from .blocks import BlockMatrix, UnsupportedType, from_gguf

FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
ROWS_AT_ONCE = 4096  # rows dequantized (or compared) at a time


@dataclass(frozen=True)
class Candidate:
    """A weight the pass may quantize, W [N, K] float32, read only when asked."""

    name: str  # "NAME" for MatMul(x, NAME), "gather:NAME" for an embedding table
    shape: tuple[int, int]
    read: Callable[[], np.ndarray] = field(compare=False)  # W [N, K] (a view of the mapped file where it can be)
    stored: Hashable = field(
        default=None, compare=False
    )  # where its values are (GraphWeights.stored): one plan per place


@dataclass(frozen=True)
class Planned:
    """One weight's blocks: their layout known when planned, the arrays made when written (`make`)."""

    kind: str  # the GGUF tensor type ("Q4_1", ...) or the re-quantization ("int4", "int8")
    bits: int
    block: int
    shape: tuple[int, int]  # (N, K)
    has_offsets: bool
    make: Callable[[], BlockMatrix] = field(compare=False, repr=False)
    ident: Hashable = (
        None  # equal idents share one set of initializers in a graph (a tied table and head); None: its own
    )

    @staticmethod
    def of(m: BlockMatrix, ident: Hashable = None) -> Planned:
        """A matrix already made."""
        return Planned(m.kind, m.bits, m.block, m.shape, m.offsets is not None, lambda: m, ident)

    @staticmethod
    def stack(parts: list[Planned]) -> Planned:
        """The rows of `parts` (one block layout) as one matrix, in order (BlockMatrix.stack, made when written)."""
        first = parts[0]
        rows = sum(p.shape[0] for p in parts)
        return Planned(
            first.kind,
            first.bits,
            first.block,
            (rows, first.shape[1]),
            first.has_offsets,
            lambda: BlockMatrix.stack([p.make() for p in parts]),
        )


@dataclass
class WeightPlan:
    """What the weight pass does to one graph: initializer -> blocks, and what stays float and why."""

    matrices: dict[str, Planned] = field(default_factory=dict)
    kept_float: dict[str, tuple[str, str]] = field(default_factory=dict)  # initializer -> (tensor type, why)
    padded_attention: int = 0  # GroupQueryAttention nodes with the extra query row (gqa_rows.py), level 4 only

    def tensor_types(self) -> dict[str, int]:
        return dict(Counter(m.kind for m in self.matrices.values()))

    def kept_types(self) -> dict[str, int]:
        return dict(Counter(kind for kind, _ in self.kept_float.values()))


@dataclass
class _Tensor:
    name: str
    kind: str
    file: Path
    offset: int  # of its blocks in the file
    raw_shape: tuple[int, int]  # [N, bytes a row]
    shape: tuple[int, int]  # (N, K)

    @property
    def raw(self) -> np.ndarray:
        """The blocks, read from the file each time they are needed: a memory map's pages would stay in the
        process's resident memory as they are read, the whole file's by the end of the pass."""
        count = self.raw_shape[0] * self.raw_shape[1]
        with open(self.file, "rb") as f:
            f.seek(self.offset)
            data = np.fromfile(f, dtype=np.uint8, count=count)
        if data.size != count:
            raise ExportCheckError(
                f"{self.file}: GGUF tensor {self.name} was cut short (the file changed while exporting)"
            )
        return data.reshape(self.raw_shape)

    def row_hashes(self) -> np.ndarray:
        """row_hashes of the values as the gguf package dequantizes them (what transformers loads), a chunk at
        a time."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = GGMLQuantizationType[self.kind]
        n, k = self.shape
        return np.concatenate(
            [
                row_hashes(dequantize(self.raw[start : start + ROWS_AT_ONCE], kind).reshape(-1, k).astype(np.float32))
                for start in range(0, n, ROWS_AT_ONCE)
            ]
        )

    def blocks(self) -> BlockMatrix:
        return from_gguf(self.kind, self.raw, *self.shape)


@dataclass
class _Signed:
    """A tensor's row hashes: sorted (stably, so the first of equal rows comes first) for look-ups."""

    tensor: _Tensor
    order: np.ndarray  # row indices sorting the hashes
    sorted: np.ndarray  # the hashes in that order

    def rows_of(self, hashes: np.ndarray) -> np.ndarray | None:
        """For each hash, the first row of the tensor with it; None when one is missing."""
        at = np.minimum(np.searchsorted(self.sorted, hashes, side="left"), len(self.sorted) - 1)
        if not np.array_equal(self.sorted[at], hashes):
            return None
        return self.order[at]


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
                raw = t.data  # the reader's map: only its shape is kept
                assert raw.dtype == np.uint8 and raw.ndim == 2, (t.name, raw.dtype, raw.shape)
                self.tensors.append(_Tensor(t.name, kind, Path(path), int(t.data_offset), tuple(raw.shape), (n, k)))
        self._signed: dict[tuple, list[_Signed]] = {}  # (shape, signature) -> tensors in file order
        self._shapes_signed: set[tuple[int, int]] = set()

    def plan(self, candidates: list[Candidate]) -> WeightPlan:
        """Unmatched candidates stay float, silently: they are float in the GGUF too (norms, biases)
        or not GGUF tensors at all. Each candidate is read, matched and verified, then dropped."""
        plan = WeightPlan()
        for candidate in candidates:
            w = candidate.read()
            found = self._find(w)
            if found is None:
                continue
            tensor, rows = found
            try:
                blocks = self._blocks_in_order(tensor, rows)
            except UnsupportedType:
                plan.kept_float[candidate.name] = (
                    tensor.kind,
                    f"{tensor.name} is {tensor.kind}, which has no exact MatMulNBits form here: kept as float32",
                )
                continue
            if not reproduces(blocks, w):
                raise ExportCheckError(
                    f"GGUF tensor {tensor.name} ({tensor.kind}) does not reproduce "
                    f"the traced weight {candidate.name} bit for bit; "
                    "export without weights='gguf' and report this"
                )
            identity = np.array_equal(rows, np.arange(len(rows)))
            ident = (
                tensor.name,
                b"" if identity else rows.tobytes(),
            )  # a tied embedding and LM head share their arrays
            plan.matrices[candidate.name] = Planned(
                blocks.kind,
                blocks.bits,
                blocks.block,
                blocks.shape,
                blocks.offsets is not None,
                lambda t=tensor, r=rows: self._blocks_in_order(t, r),
                ident,
            )
            del w, blocks
        return plan

    def _find(self, w: np.ndarray) -> tuple[_Tensor, np.ndarray] | None:
        shape = tuple(w.shape)
        if not any(t.shape == shape for t in self.tensors):
            return None
        self._sign(shape)
        hashes = row_hashes(w)
        for signed in self._signed.get((shape, _signature(hashes)), []):
            rows = signed.rows_of(hashes)
            if rows is not None:
                return signed.tensor, rows
        return None

    def _sign(self, shape: tuple[int, int]) -> None:
        """Hash the rows of every tensor of this shape, once."""
        if shape in self._shapes_signed:
            return
        self._shapes_signed.add(shape)
        for tensor in self.tensors:
            if tensor.shape == shape:
                hashes = tensor.row_hashes()
                order = np.argsort(hashes, kind="stable")
                self._signed.setdefault((shape, _signature(hashes)), []).append(_Signed(tensor, order, hashes[order]))

    @staticmethod
    def _blocks_in_order(tensor: _Tensor, rows: np.ndarray) -> BlockMatrix:
        """The tensor's blocks with its rows in graph order."""
        blocks = tensor.blocks()
        return blocks if np.array_equal(rows, np.arange(len(rows))) else blocks.take_rows(rows)


def _signature(hashes: np.ndarray) -> int:
    """The sum of a tensor's row hashes (mod 2**64): the same for any order of the same rows."""
    with np.errstate(over="ignore"):
        return int(hashes.sum(dtype=np.uint64))


def reproduces(blocks: BlockMatrix, w: np.ndarray) -> bool:
    """blocks dequantize to W's float32 bits exactly (compared a chunk of rows at a time)."""
    for start in range(0, blocks.shape[0], ROWS_AT_ONCE):
        part = blocks.take_rows(slice(start, start + ROWS_AT_ONCE)).dequantize()
        if not np.array_equal(
            part.view(np.uint32),
            np.ascontiguousarray(w[start : start + ROWS_AT_ONCE], dtype=np.float32).view(np.uint32),
        ):
            return False
    return True


def row_hashes(w: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """An exact hash of each row's float32 bits (equal rows, equal hashes; -0.0 and 0.0 differ)."""
    coeffs = np.random.default_rng(0).integers(1, 2**63, size=w.shape[1], dtype=np.uint64) | np.uint64(1)
    out = np.empty(w.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, w.shape[0], chunk):  # each chunk made contiguous alone: W may be a transposed view
            part = np.ascontiguousarray(w[start : start + chunk], dtype=np.float32).view(np.uint32).astype(np.uint64)
            out[start : start + chunk] = (part * coeffs).sum(axis=1)  # wraps modulo 2**64
    return out
