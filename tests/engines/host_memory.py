"""HostMemory: CudaMemory's calls on host memory, so DeviceKV's layout and copies run without a GPU.

copy_3d follows cudaMemcpy3D's addressing (byte x, row y, slice z at base + x0 + (z*ysize + y)*pitch + x)
and checks what CUDA would not forgive: every byte inside an allocation, source and destination apart.
"""

from __future__ import annotations

import ctypes

import numpy as np

from jacobi_rt.runtime.backends.device_kv import ALIGN


class HostMemory:
    device = "cpu"

    def __init__(self):
        self.buffers: dict[int, np.ndarray] = {}
        self.copies = 0

    def alloc(self, nbytes: int) -> int:
        raw = np.full(nbytes + ALIGN, 0xAB, dtype=np.uint8)  # garbage, as cudaMalloc gives
        ptr = -(-raw.ctypes.data // ALIGN) * ALIGN
        self.buffers[ptr] = (raw, nbytes)
        return ptr

    def free(self, ptr: int) -> None:
        del self.buffers[ptr]

    def owner(self, start: int, nbytes: int) -> int:
        for base, (_, size) in self.buffers.items():
            if base <= start and start + nbytes <= base + size:
                return base
        raise AssertionError(f"bytes [{start:#x}, +{nbytes}) are outside every allocation")

    def copy_3d(self, dst, src, width: int, height: int, depth: int) -> None:
        if not (width and height and depth):
            return
        self.copies += 1
        pairs = []
        for z in range(depth):
            for y in range(height):
                d = dst.base + dst.x0 + (z * dst.ysize + y) * dst.pitch
                s = src.base + src.x0 + (z * src.ysize + y) * src.pitch
                assert self.owner(d, width) != self.owner(s, width), "a 3-D copy within one buffer may overlap"
                pairs.append((d, s))
        written = sorted(d for d, _ in pairs)
        assert all(b - a >= width for a, b in zip(written, written[1:])), "the 3-D copy's writes overlap"
        for d, s in pairs:
            ctypes.memmove(d, s, width)

    def download(self, src: int, nbytes: int) -> np.ndarray:
        if nbytes:
            self.owner(src, nbytes)
        return np.frombuffer(ctypes.string_at(src, nbytes), dtype=np.uint8).copy()

    def upload(self, dst: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data).view(np.uint8).ravel()
        if data.size:
            self.owner(dst, data.size)
            ctypes.memmove(dst, data.ctypes.data, data.size)

    def synchronize(self) -> None:
        pass
