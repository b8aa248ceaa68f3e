"""The KV cache on a device: two buffers ("sides"), and the commit/trim calls that move it in one copy.

Layout. Each side holds every layer's past (rows = layers x {key, value}) as one dense array for
the current length L: row r is a [B*H, L, D] block stack starting at `base + r * stride(L)`. A
pass reads the past from one side and the graph writes its present ([B*H, L+W, D] per row) into
the other. When the whole window is kept, the present side simply becomes the cache; otherwise
the kept entries are gathered into the other side with ONE 3-D device copy per contiguous run
(x = bytes of the kept entries, y = the B*H blocks, z = the rows), not one per layer and head.

Why stride(L) pads each row to a whole number of blocks: TensorRT wants every tensor address
256-byte aligned, and a 3-D copy needs the row stride to be a multiple of the block pitch, so
rows are padded with a few empty blocks (at most 1 for fp16 and head_dim 64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from .base import BackendContext
from .cuda import Pitched

ALIGN = 256


class DeviceKV:
    """Two sides of `rows` x [blocks, capacity, entry bytes]; memory is a CudaMemory (or a test double)."""

    def __init__(self, memory, rows: int, blocks: int, capacity: int, entry: int):
        self.memory, self.rows, self.blocks, self.capacity, self.entry = memory, rows, blocks, capacity, entry
        worst_unit = ALIGN // math.gcd(ALIGN, entry)  # stride(L)'s padding unit divides this for every L
        self.side_bytes = rows * round_up(blocks, worst_unit) * capacity * entry
        self.bases: list[int] = []
        try:
            for _ in range(2):
                self.bases.append(memory.alloc(self.side_bytes))
        except Exception:
            self.free()  # the first side, when the second does not fit
            raise

    def ysize(self, length: int) -> int:
        """Blocks per row, padded so that a row of `length` entries is a multiple of 256 bytes."""
        if length == 0:
            return self.blocks
        return round_up(self.blocks, ALIGN // math.gcd(ALIGN, length * self.entry))

    def stride(self, length: int) -> int:
        return self.ysize(length) * length * self.entry

    def addresses(self, side: int, length: int) -> list[int]:
        """Each row's address on `side` for a cache of `length` entries (what the graph binds)."""
        base, stride = self.bases[side], self.stride(length)
        return [base + r * stride for r in range(self.rows)]

    def gather(self, side: int, length: int, runs: list[tuple[int, int]]) -> int:
        """Copy entries [a, b) of each run, in order, from `side` (length entries) to the other side,
        densely; returns the new length. One device copy per run."""
        src = Pitched(self.bases[side], 0, length * self.entry, self.ysize(length))
        new = sum(b - a for a, b in runs)
        dst_base, dst_pitch, dst_ysize = self.bases[side ^ 1], new * self.entry, self.ysize(new)
        x = 0
        for a, b in runs:
            self.memory.copy_3d(
                Pitched(dst_base, x * self.entry, dst_pitch, dst_ysize),
                Pitched(src.base, a * self.entry, src.pitch, src.ysize),
                width=(b - a) * self.entry,
                height=self.blocks,
                depth=self.rows,
            )
            x += b - a
        return new

    def read(self, side: int, length: int, row: int) -> np.ndarray:
        """One row's [blocks, length, entry] bytes, copied to the host (for tests and tools)."""
        return self.memory.download(self.addresses(side, length)[row], self.blocks * length * self.entry)

    def free(self) -> None:
        bases, self.bases = [b for b in self.bases if b], [0, 0]
        release(lambda base=base: self.memory.free(base) for base in bases)


def release(actions: Iterable[Callable[[], None]]) -> None:
    """Run every release action even when some fail (a failed free must not leak the rest), then
    raise the first failure."""
    first = None
    for action in actions:
        try:
            action()
        except Exception as exc:  # CUDA's errors, and whatever a test double raises
            first = first or exc
    if first is not None:
        raise first


def round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def kept_runs(past: int, rows: list[int]) -> list[tuple[int, int]]:
    """The cache entries to keep after verifying a tree window: the past, then window `rows`
    (ascending, distinct), as maximal contiguous [start, stop) runs."""
    runs = [(0, past)] if past else []
    for position in (past + r for r in rows):
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


class DeviceKVContext(BackendContext):
    """commit / commit_rows / trim (BackendContext's, through `_compact` and `_gather`) / kv on a DeviceKV; the
    backend's forward() binds `self._kv.addresses(self._current, past)` as the past and the other side as the
    present, then flips `self._current`, so after a pass the current side holds length + pending entries."""

    _kv: DeviceKV
    _current: int
    dtype: np.dtype  # the cache's

    def _gather(self, old: int, rows: list[int]) -> None:
        self._keep(old, kept_runs(self.length, rows))

    def _compact(self, old: int, new: int) -> None:
        self._keep(old, [(0, new)] if new else [])

    def _keep(self, old: int, runs: list[tuple[int, int]]) -> None:
        self._check_open()
        if runs == [(0, old)] or (old == 0 and not runs):
            self.length = old  # nothing dropped: the current side already is the cache
            return
        self.length = self._kv.gather(self._current, old, runs)
        self._current ^= 1
        self._after_copy()

    def _after_copy(self) -> None:
        """Hook: order the copy before the next pass (onnxruntime runs on its own stream)."""

    def kv(self, layer: int, kind: str = "key") -> np.ndarray:
        """The committed cache of one layer, [B, H, length, D], copied from the device (tests and tools)."""
        self._check_open()
        raw = self._kv.read(self._current, self.length, 2 * layer + (kind == "value"))
        heads, head_dim = self._kv.blocks // self.batch, self._kv.entry // self.dtype.itemsize
        return raw.view(self.dtype).reshape(self.batch, heads, self.length, head_dim)

    def close(self) -> None:
        kv, self._kv = getattr(self, "_kv", None), None
        release([kv.free] if kv is not None else [])
        super().close()
