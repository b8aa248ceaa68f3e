"""Block-quantized matrices in onnxruntime's `MatMulNBits` layout, from a GGUF tensor or from floats.

A `BlockMatrix` holds W [N, K] (N outputs, K inputs) as blocks of `block` values along K:

    W[n, k] = scale[n, b] * (q[n, k] - zero) + offset[n, b]        b = k // block, zero = 2**(bits-1)

`MatMulNBits` computes the first term with its implied zero point (8 for 4 bits, 128 for 8 bits:
no zero-point input, the fast kernel path); the offset term, when there is one, is added by the
graph as blocksum(x) @ offset.T (see quantize.py). GGUF types map without rounding again:

    Q4_0  w = d*(q-8)                 4 bits, scale d
    Q8_0  w = d*q      (q int8)       8 bits, stored q+128, scale d
    Q4_1  w = d*q + m                 4 bits, scale d, offset m + 8d   (d*q + m = d*(q-8) + (m+8d))
    Q5_0  w = d*(q-16)                8 bits, stored q+112, scale d
    Q5_1  w = d*q + m                 8 bits, stored q+128, scale d, offset m
    Q4_K  w = (d*sc)*q - dmin*mn      sub-blocks of 32 with 6-bit sc, mn: as Q4_1 with s = d*sc, m = -dmin*mn
    Q5_K  the same with 5-bit q       8 bits, stored q+128, scale s, offset -dmin*mn
    Q6_K  w = (d*sc)*(q-32)           sub-blocks of 16 with int8 sc: 8 bits, stored q+96, scale d*sc
    Q3_K  w = (d*sc)*q, q in [-4, 3]  sub-blocks of 16 with 6-bit signed sc: 4 bits, stored q+8
    Q2_K  w = (d*sc)*q - dmin*mn      sub-blocks of 16 with 4-bit sc, mn, 2-bit q: Q4_1's form in blocks of 16

The offset form keeps 4 bits only when m + 8s is a float32 without rounding for every block of the
tensor (the weight must stay bit for bit the GGUF's); otherwise the tensor takes 8 bits, q + 128 with
offset m itself, which is exact always. Other types (IQ*, TQ*, ...) raise UnsupportedType;
the caller keeps that tensor in float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROWS_AT_ONCE = 1024  # rows of a float weight rounded at a time
BLOCK = 32  # the block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the sub-blocks of Q4_K, Q5_K along K


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

    def take_rows(self, rows: np.ndarray) -> BlockMatrix:
        offsets = None if self.offsets is None else self.offsets[rows]
        return BlockMatrix(self.kind, self.bits, self.block, self.q[rows], self.scales[rows], offsets)

    @staticmethod
    def stack(parts: list[BlockMatrix]) -> BlockMatrix:
        """The rows of `parts` (one block layout) as one matrix, in order."""
        first = parts[0]
        offsets = None if first.offsets is None else np.concatenate([p.offsets for p in parts])
        return BlockMatrix(
            first.kind,
            first.bits,
            first.block,
            np.concatenate([p.q for p in parts]),
            np.concatenate([p.scales for p in parts]),
            offsets,
        )

    @property
    def nbytes(self) -> int:
        return self.q.size * self.bits // 8 + self.scales.nbytes + (0 if self.offsets is None else self.offsets.nbytes)


# --- from a GGUF tensor's raw blocks --------------------------------------------------------------

# type -> bytes per block of 32, and per K-quant super-block of 256
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
SUPER = 256
_SUPER_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
SUPPORTED_TYPES = (*_BLOCK_BYTES, *_SUPER_BYTES)


def from_gguf(kind: str, raw: np.ndarray, n: int, k: int) -> BlockMatrix:
    """The GGUF tensor of type `kind` (raw bytes, rows of k values, n rows) as a BlockMatrix."""
    if kind in _SUPER_BYTES:
        return _from_k_quant(kind, _bytes(raw).reshape(n * k // SUPER, _SUPER_BYTES[kind]), n, k)
    if kind not in _BLOCK_BYTES:
        raise UnsupportedType(kind)
    blocks = _bytes(raw).reshape(n, k // BLOCK, _BLOCK_BYTES[kind])
    d = _halves(blocks[..., 0:2])
    if kind == "Q8_0":
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return BlockMatrix(kind, 8, BLOCK, q.reshape(n, k), d)
    qs = blocks[..., -16:]  # [n, nb, 16]: element j in the low nibble, element j+16 in the high one
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
    if kind in ("Q5_0", "Q5_1"):  # the fifth bit of element j is bit j of the 4 bytes before qs (little-endian)
        q = q | (_unpack(blocks[..., -20:-16].reshape(-1, 4), 1, range(8), 1).reshape(n, k) << 4)
    if kind == "Q4_0":
        return BlockMatrix(kind, 4, BLOCK, q, d)
    if kind == "Q5_0":
        return BlockMatrix(kind, 8, BLOCK, q + 112, d)
    return _with_offsets(kind, q, d, _halves(blocks[..., 2:4]), BLOCK)


def _bytes(raw: np.ndarray) -> np.ndarray:
    return np.frombuffer(np.ascontiguousarray(raw).tobytes(), dtype=np.uint8)


def _unpack(fields: np.ndarray, width: int, shifts, mask: int) -> np.ndarray:
    """ggml's bit planes: each run of `width` bytes of a row holds one field per shift (a field's bits
    at that shift), the runs' shifts in turn: [rows, bytes] -> [rows, bytes * len(shifts)], in order
    run, shift, byte."""
    shifts = np.asarray(list(shifts), np.uint8)[:, None]
    return ((fields.reshape(len(fields), -1, 1, width) >> shifts) & mask).reshape(len(fields), -1)


def _halves(pairs: np.ndarray) -> np.ndarray:
    """float16 values stored as byte pairs [..., 2] -> float32 [...]."""
    return np.ascontiguousarray(pairs).view(np.float16)[..., 0].astype(np.float32)


def _with_offsets(kind: str, q: np.ndarray, scales: np.ndarray, m: np.ndarray, block: int) -> BlockMatrix:
    """w = scale*q + m per block (q unsigned): 4 bits with offset m + 8*scale when q fits 4 bits and that
    offset is exact in float32 for every block, else 8 bits (q + 128) with offset m."""
    n, k = q.shape
    if q.max(initial=0) < 16:
        exact = m.astype(np.float64) + 8 * scales.astype(np.float64)  # float64 holds it without rounding
        if np.array_equal(exact.astype(np.float32).astype(np.float64), exact):
            return BlockMatrix(kind, 4, block, q, scales, offsets=exact.astype(np.float32))
    return BlockMatrix(kind, 8, block, (q.astype(np.uint16) + 128).astype(np.uint8), scales, offsets=m)


def _from_k_quant(kind: str, blocks: np.ndarray, n: int, k: int) -> BlockMatrix:
    """Super-blocks [n*k/256, bytes] of a K-quant (ggml's layouts) as a BlockMatrix."""
    if kind in ("Q2_K", "Q3_K"):
        return _from_small_k_quant(kind, blocks, n, k)
    if kind == "Q6_K":  # ql 128 | qh 64 | scales 16 (int8) | d
        ql, qh, sc, d = np.split(blocks, [128, 192, 208], axis=1)
        q = _unpack(ql, 64, (0, 4), 0x0F) | (_unpack(qh, 32, (0, 2, 4, 6), 0x03) << 4)  # 6 bits, w = d*sc*(q - 32)
        scales = _halves(d[:, None, :]) * sc.view(np.int8).astype(np.float32)  # [super, 16]
        return BlockMatrix(kind, 8, 16, (q + 96).reshape(n, k), scales.reshape(n, k // 16))
    # Q4_K: d | dmin | scales 12 | qs 128;  Q5_K: d | dmin | scales 12 | qh 32 | qs 128
    d, dmin = _halves(blocks[:, 0:2])[:, None], _halves(blocks[:, 2:4])[:, None]
    sc, mn = _scale_min(blocks[:, 4:16])
    q = _unpack(blocks[:, -128:], 32, (0, 4), 0x0F)
    if kind == "Q5_K":
        q = q | (_unpack(blocks[:, 16:48], 32, range(8), 1) << 4)
    scales, m = d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))  # [super, 8]
    return _with_offsets(kind, q.reshape(n, k), scales.reshape(n, k // BLOCK), m.reshape(n, k // BLOCK), BLOCK)


def _from_small_k_quant(kind: str, blocks: np.ndarray, n: int, k: int) -> BlockMatrix:
    """Q2_K (scales 16 | qs 64 | d | dmin) and Q3_K (hmask 32 | qs 64 | scales 12 | d): sub-blocks of 16,
    each 2-bit field of qs holding element i of sub-blocks j, j+4, j+8, j+12 of its half."""
    qs = blocks[:, 16:80] if kind == "Q2_K" else blocks[:, 32:96]
    low = _unpack(qs, 32, (0, 2, 4, 6), 0x03)
    if kind == "Q2_K":
        d, dmin = _halves(blocks[:, 80:82])[:, None], _halves(blocks[:, 82:84])[:, None]
        scales, m = d * (blocks[:, :16] & 0x0F).astype(np.float32), -(dmin * (blocks[:, :16] >> 4).astype(np.float32))
        return _with_offsets(kind, low.reshape(n, k), scales.reshape(n, k // 16), m.reshape(n, k // 16), 16)
    # the signed value is q - 4 (a clear mask bit subtracts 4), stored with zero 8 as q + 4
    q = low + 4 * _unpack(blocks[:, :32], 32, range(8), 1)
    packed = blocks[:, 96:108]  # 16 6-bit scales: low nibbles from bytes 0-7, top 2 bits from bytes 8-11
    sc = _unpack(packed[:, :8], 8, (0, 4), 0x0F) | (_unpack(packed[:, 8:], 4, (0, 2, 4, 6), 0x03) << 4)
    sc = sc.astype(np.float32) - 32
    scales = _halves(blocks[:, 108:110])[:, None] * sc
    return BlockMatrix(kind, 4, 16, (q + 4).reshape(n, k).astype(np.uint8), scales.reshape(n, k // 16))


def _scale_min(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes): bytes 0-3 hold the low
    6 bits of scales 0-3, bytes 4-7 of mins 0-3; scales and mins 4-7 take their low 4 bits from bytes
    8-11 and their top 2 bits from the top of bytes 0-3 and 4-7."""
    first, second, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([first & 0x3F, (rest & 0x0F) | ((first >> 2) & 0x30)], axis=1)
    mn = np.concatenate([second & 0x3F, (rest >> 4) | ((second >> 2) & 0x30)], axis=1)
    return sc, mn


# --- from float weights (--quantize): llama.cpp's Q4_0 / Q8_0 rounding -----------------------------


def quantize_float(w: np.ndarray, bits: int, block: int = BLOCK) -> BlockMatrix:
    """Symmetric round-to-nearest per block of `block` along K, no zero point (the fast kernel).

    4 bits as llama.cpp's Q4_0: the value of largest magnitude maps to -8, so all 16 levels are used.
    Rows are rounded ROWS_AT_ONCE at a time (each row is alone), so W may be a mapped, transposed
    view: only a chunk of it is ever copied.
    """
    n, k = w.shape
    parts = [
        _quantize_rows(np.ascontiguousarray(w[start : start + ROWS_AT_ONCE], dtype=np.float32), bits, block)
        for start in range(0, n, ROWS_AT_ONCE)
    ]
    q, d = parts[0] if len(parts) == 1 else (np.concatenate(arrays) for arrays in zip(*parts))
    return BlockMatrix(f"int{bits}", bits, block, q, d)


def _quantize_rows(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    n, k = w.shape
    x = w.reshape(n, k // block, block)
    if bits == 8:
        d = np.abs(x).max(axis=-1) / 127
        inv = np.divide(1, d, out=np.zeros_like(d), where=d > 0)
        q = np.clip(np.rint(x * inv[..., None]), -127, 127) + 128
    else:
        extreme = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        d = extreme / -8
        inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
        q = np.clip(np.floor(x * inv[..., None] + 8.5), 0, 15)
    return q.astype(np.uint8).reshape(n, k), d.astype(np.float32)
