"""HostMemory: CudaMemory's calls on host memory, so DeviceKV's layout and copies run without a GPU.

copy_3d follows cudaMemcpy3D's addressing (byte x, row y, slice z at base + x0 + (z*ysize + y)*pitch + x)
and checks what CUDA would not forgive: every byte inside an allocation, source and destination apart.
`fail_alloc=n` makes the n-th allocation fail (out of memory), `fail_free` the frees of those
addresses, so the error paths can be checked to leave nothing allocated (`buffers` empty).
HostCuda: the Cuda calls TrtContext makes (buffers, pinned memory, streams, copies) on a HostMemory.
"""

from __future__ import annotations

import ctypes

import numpy as np

from jacobi_rt.runtime.backends.device_kv import ALIGN
from jacobi_rt.runtime.errors import BackendError


class HostMemory:
    def __init__(self, fail_alloc: int | None = None):
        self.buffers: dict[int, np.ndarray] = {}
        self.copies = 0
        self.allocations = 0
        self.fail_alloc = fail_alloc
        self.fail_free: set[int] = set()

    def alloc(self, nbytes: int) -> int:
        self.allocations += 1
        if self.allocations == self.fail_alloc:
            raise BackendError(f"CUDA error 2 (cudaErrorMemoryAllocation) in cudaMalloc({nbytes} bytes)")
        raw = np.full(nbytes + ALIGN, 0xAB, dtype=np.uint8)  # garbage, as cudaMalloc gives
        ptr = -(-raw.ctypes.data // ALIGN) * ALIGN
        self.buffers[ptr] = (raw, nbytes)
        return ptr

    def free(self, ptr: int) -> None:
        if ptr in self.fail_free:
            raise BackendError("CUDA error 700 (cudaErrorIllegalAddress) in cudaFree")
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


class HostCuda:
    """Cuda's calls (runtime/backends/cuda.py) on a HostMemory: TrtContext's allocations without a GPU."""

    def __init__(self, memory: HostMemory):
        self.memory = memory
        self.streams: set[int] = set()
        self._next_stream = 1

    def malloc(self, nbytes: int) -> int:
        return self.memory.alloc(nbytes)

    def free(self, ptr: int) -> None:
        self.memory.free(ptr)

    def host_malloc(self, nbytes: int):
        ptr = self.memory.alloc(nbytes)
        return ptr, np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))

    def host_free(self, ptr: int) -> None:
        self.memory.free(ptr)

    def stream_create(self) -> int:
        self._next_stream += 1
        self.streams.add(self._next_stream)
        return self._next_stream

    def stream_destroy(self, stream: int) -> None:
        self.streams.remove(stream)

    def stream_synchronize(self, stream: int) -> None:
        pass

    def copy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        if nbytes:
            ctypes.memmove(dst, src, nbytes)

    def copy_3d_async(self, dst, src, width: int, height: int, depth: int, stream: int) -> None:
        self.memory.copy_3d(dst, src, width, height, depth)
