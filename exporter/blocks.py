"""Block-quantized matrices in onnxruntime's `MatMulNBits` layout, from a GGUF tensor or from floats.

A `BlockMatrix` holds W [N, K] (N outputs, K inputs) as blocks of `block` values along K:

    W[n, k] = scale[n, b] * (q[n, k] - zero) + offset[n, b]        b = k // block, zero = 2**(bits-1)

`MatMulNBits` computes the first term with its implied zero point (8 for 4 bits, 128 for 8 bits:
no zero-point input, the fast kernel path); the offset term, when there is one, is added by the
graph as blocksum(x) @ offset.T (see quantize.py). GGUF types map without rounding again:

    Q4_0  w = d*(q-8)                 4 bits, scale d
    Q8_0  w = d*q      (q int8)       8 bits, stored q+128, scale d
    Q4_1  w = d*q + m                 4 bits, scale d, offset m + 8d   (d*q + m = d*(q-8) + (m+8d))

Other types (K-quants, Q5_*, IQ*) raise UnsupportedType; the caller keeps that tensor in float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32  # the block of Q4_0, Q4_1 and Q8_0 along K


class UnsupportedType(Exception):
    """A GGUF tensor type with no exact MatMulNBits form here."""


@dataclass
class BlockMatrix:
    kind: str  # the GGUF tensor type ("Q4_1", ...) or the re-quantization ("int4", "int8")
    bits: int  # 4 or 8
    block: int
    q: np.ndarray  # uint8 [N, K], unpacked values in [0, 2**bits)
    scales: np.ndarray  # float32 [N, K // block]
    offsets: np.ndarray | None = None  # float32 [N, K // block], or None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def zero(self) -> int:
        return 1 << (self.bits - 1)

    def packed(self) -> np.ndarray:
        """uint8 [N, K // block, block * bits // 8]: MatMulNBits' B (4 bits: low nibble first)."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // self.block, self.block)
        if self.bits == 8:
            return np.ascontiguousarray(q)
        return np.ascontiguousarray(q[..., 0::2] | (q[..., 1::2] << 4))

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], computed in float64 and rounded once (what the blocks represent)."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // self.block, self.block).astype(np.float64) - self.zero
        w = q * self.scales.astype(np.float64)[..., None]
        if self.offsets is not None:
            w += self.offsets.astype(np.float64)[..., None]
        return w.reshape(n, k).astype(np.float32)

    def take_rows(self, rows: np.ndarray) -> "BlockMatrix":
        offsets = None if self.offsets is None else self.offsets[rows]
        return BlockMatrix(self.kind, self.bits, self.block, self.q[rows], self.scales[rows], offsets)

    @staticmethod
    def stack(parts: list["BlockMatrix"]) -> "BlockMatrix":
        """The rows of `parts` (one block layout) as one matrix, in order."""
        first = parts[0]
        offsets = None if first.offsets is None else np.concatenate([p.offsets for p in parts])
        return BlockMatrix(first.kind, first.bits, first.block, np.concatenate([p.q for p in parts]),
                           np.concatenate([p.scales for p in parts]), offsets)

    @property
    def nbytes(self) -> int:
        return self.q.size * self.bits // 8 + self.scales.nbytes + (0 if self.offsets is None else self.offsets.nbytes)


# --- from a GGUF tensor's raw blocks --------------------------------------------------------------

# type -> bytes per block of 32
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
SUPPORTED_TYPES = tuple(_BLOCK_BYTES)


def from_gguf(kind: str, raw: np.ndarray, n: int, k: int) -> BlockMatrix:
    """The GGUF tensor of type `kind` (raw bytes, rows of k values, n rows) as a BlockMatrix."""
    if kind not in _BLOCK_BYTES:
        raise UnsupportedType(kind)
    blocks = np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.uint8).reshape(n, k // BLOCK, _BLOCK_BYTES[kind])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return BlockMatrix(kind, 8, BLOCK, q.reshape(n, k), d)
    start = 2 if kind == "Q4_0" else 4
    qs = blocks[..., start:]  # [n, nb, 16]: element j in the low nibble, element j+16 in the high one
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
    if kind == "Q4_0":
        return BlockMatrix(kind, 4, BLOCK, q, d)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return BlockMatrix(kind, 4, BLOCK, q, d, offsets=m + np.float32(8) * d)


# --- from float weights (--quantize): llama.cpp's Q4_0 / Q8_0 rounding -----------------------------


def quantize_float(w: np.ndarray, bits: int, block: int = BLOCK) -> BlockMatrix:
    """Symmetric round-to-nearest per block of `block` along K, no zero point (the fast kernel).

    4 bits as llama.cpp's Q4_0: the value of largest magnitude maps to -8, so all 16 levels are used.
    """
    n, k = w.shape
    x = w.reshape(n, k // block, block).astype(np.float32)
    if bits == 8:
        d = np.abs(x).max(axis=-1) / 127
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        q = np.clip(np.rint(x * inv[..., None]), -127, 127) + 128
    else:
        extreme = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        d = extreme / -8
        inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor(x * inv[..., None] + 8.5), 0, 15)
    return BlockMatrix(f"int{bits}", bits, block, q.astype(np.uint8).reshape(n, k), d.astype(np.float32))
