"""CUDA through ctypes over libcudart: device memory, one stream, copies, and the GPU's identity.

Why our own ctypes and not polygraphy.cuda or cuda-python: the runtime needs 3-D strided copies
(one call moves the whole KV cache), pinned host memory and the device's name and compute
capability; polygraphy.cuda has none of these, and the onnxruntime CUDA path should not need
polygraphy. cuda-python would be one more dependency whose module layout changed between CUDA
12 and 13. Every call is checked and fails with a BackendError naming the CUDA error.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BackendError

CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so", "libcudart.so.11.0")
CUDART_HINT = (
    "install the CUDA runtime (pip install nvidia-cuda-runtime-cu12, or the CUDA toolkit) and put "
    "libcudart on LD_LIBRARY_PATH"
)
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3
NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with the legacy default stream
COMPUTE_MAJOR, COMPUTE_MINOR = 75, 76  # cudaDevAttrComputeCapabilityMajor / Minor


class _Pos(ctypes.Structure):
    _fields_ = [("x", ctypes.c_size_t), ("y", ctypes.c_size_t), ("z", ctypes.c_size_t)]


class _PitchedPtr(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_void_p),
        ("pitch", ctypes.c_size_t),
        ("xsize", ctypes.c_size_t),
        ("ysize", ctypes.c_size_t),
    ]


class _Extent(ctypes.Structure):
    _fields_ = [("width", ctypes.c_size_t), ("height", ctypes.c_size_t), ("depth", ctypes.c_size_t)]


class _Memcpy3DParms(ctypes.Structure):
    _fields_ = [
        ("srcArray", ctypes.c_void_p),
        ("srcPos", _Pos),
        ("srcPtr", _PitchedPtr),
        ("dstArray", ctypes.c_void_p),
        ("dstPos", _Pos),
        ("dstPtr", _PitchedPtr),
        ("extent", _Extent),
        ("kind", ctypes.c_int),
    ]


@dataclass(frozen=True)
class Pitched:
    """A 3-D byte region of linear memory: byte (x, y, z) lives at base + x0 + (z * ysize + y) * pitch + x."""

    base: int
    x0: int  # byte offset of the region inside each row
    pitch: int  # bytes from one row (y) to the next
    ysize: int  # rows per slice: slices are ysize * pitch bytes apart


@dataclass(frozen=True)
class GpuFacts:
    """What an engine is tied to: the GPU model and its compute capability."""

    name: str
    compute_capability: str  # "9.0"

    @property
    def sm(self) -> str:
        return "sm" + self.compute_capability.replace(".", "")


class Cuda:
    """The loaded libcudart with checked calls (device 0, or whatever CUDA_VISIBLE_DEVICES exposes first)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.cudaGetErrorName.restype = ctypes.c_char_p

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise BackendError(f"CUDA error {status} ({self.error_name(status)}) in {what}")

    def error_name(self, status: int) -> str:
        name = self.lib.cudaGetErrorName(ctypes.c_int(status))
        return name.decode() if name else "unknown"

    def device_count(self) -> tuple[int, int]:
        """(status, count): status 0 when the driver answered."""
        count = ctypes.c_int(0)
        status = self.lib.cudaGetDeviceCount(ctypes.byref(count))
        return status, count.value

    def attribute(self, attribute: int, device: int = 0) -> int:
        value = ctypes.c_int(0)
        self.check(
            self.lib.cudaDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(attribute), ctypes.c_int(device)),
            "cudaDeviceGetAttribute",
        )
        return value.value

    def device_name(self, device: int = 0) -> str:
        # cudaDeviceProp starts with `char name[256]` in every CUDA version; its size changes, so
        # the buffer is generous. CUDA 12 exports the current layout as ..._v2, CUDA 13 without it.
        get = getattr(self.lib, "cudaGetDeviceProperties_v2", None) or self.lib.cudaGetDeviceProperties
        buffer = ctypes.create_string_buffer(8192)
        self.check(get(buffer, ctypes.c_int(device)), "cudaGetDeviceProperties")
        return buffer.raw[:256].split(b"\0", 1)[0].decode(errors="replace")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self.check(
            self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), f"cudaMalloc({nbytes} bytes)"
        )
        return ptr.value

    def free(self, ptr: int) -> None:
        self.check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def host_malloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Pinned host memory (fast, truly asynchronous copies) and a uint8 numpy view of it."""
        ptr = ctypes.c_void_p()
        self.check(
            self.lib.cudaMallocHost(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))),
            f"cudaMallocHost({nbytes} bytes)",
        )
        return ptr.value, np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr.value))

    def host_free(self, ptr: int) -> None:
        self.check(self.lib.cudaFreeHost(ctypes.c_void_p(ptr)), "cudaFreeHost")

    def stream_create(self) -> int:
        stream = ctypes.c_void_p()
        self.check(
            self.lib.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(NON_BLOCKING)),
            "cudaStreamCreateWithFlags",
        )
        return stream.value

    def stream_synchronize(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def stream_destroy(self, stream: int) -> None:
        self.check(self.lib.cudaStreamDestroy(ctypes.c_void_p(stream)), "cudaStreamDestroy")

    def copy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        if nbytes:
            status = self.lib.cudaMemcpyAsync(
                ctypes.c_void_p(dst),
                ctypes.c_void_p(src),
                ctypes.c_size_t(nbytes),
                ctypes.c_int(kind),
                ctypes.c_void_p(stream),
            )
            self.check(status, "cudaMemcpyAsync")

    def copy_3d_async(self, dst: Pitched, src: Pitched, width: int, height: int, depth: int, stream: int) -> None:
        """Device-to-device copy of `depth` slices of `height` rows of `width` bytes, in one call."""
        if not (width and height and depth):
            return
        p = _Memcpy3DParms()
        p.srcPos, p.dstPos = _Pos(src.x0, 0, 0), _Pos(dst.x0, 0, 0)
        p.srcPtr = _PitchedPtr(src.base, src.pitch, src.pitch, src.ysize)
        p.dstPtr = _PitchedPtr(dst.base, dst.pitch, dst.pitch, dst.ysize)
        p.extent = _Extent(width, height, depth)
        p.kind = DEVICE_TO_DEVICE
        self.check(self.lib.cudaMemcpy3DAsync(ctypes.byref(p), ctypes.c_void_p(stream)), "cudaMemcpy3DAsync")


class CudaMemory:
    """Device memory and copies on one stream: what DeviceKV needs from CUDA."""

    def __init__(self, cuda: Cuda, stream: int):
        self.cuda, self.stream = cuda, stream

    def alloc(self, nbytes: int) -> int:
        return self.cuda.malloc(nbytes)  # cudaMalloc aligns to at least 256 bytes

    def free(self, ptr: int) -> None:
        self.cuda.free(ptr)

    def copy_3d(self, dst: Pitched, src: Pitched, width: int, height: int, depth: int) -> None:
        self.cuda.copy_3d_async(dst, src, width, height, depth, self.stream)

    def download(self, src: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, dtype=np.uint8)
        self.cuda.copy_async(out.ctypes.data, src, nbytes, DEVICE_TO_HOST, self.stream)
        self.synchronize()
        return out

    def synchronize(self) -> None:
        self.cuda.stream_synchronize(self.stream)


@functools.lru_cache(maxsize=1)
def cudart() -> Cuda | None:
    """libcudart, or None when no CUDA runtime library can be found."""
    for candidate in _candidates():
        try:
            return Cuda(ctypes.CDLL(candidate))
        except OSError:
            continue
    return None


def _candidates() -> list[str]:
    """The copy already in the process (loaded by onnxruntime or TensorRT) first, then the loader's
    search path, then the pip wheels' folders (nvidia-cuda-runtime-cu12 / CUDA 13's nvidia/cu13)."""
    found = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if "/libcudart.so" in path and path not in found:
                found.append(path)
    except OSError:
        pass
    found += CUDART_NAMES
    for root in sys.path:
        found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")), reverse=True)
    return found


def load_cudart() -> Cuda:
    cuda = cudart()
    if cuda is None:
        raise BackendError(f"no CUDA runtime library (libcudart) was found; {CUDART_HINT}")
    return cuda


def device_count() -> int:
    """CUDA devices visible (0 without a driver, a runtime or a GPU)."""
    cuda = cudart()
    if cuda is None:
        return 0
    status, count = cuda.device_count()
    return count if status == 0 else 0


def gpu_facts(cuda: Cuda | None = None, device: int = 0) -> GpuFacts:
    """The GPU's name and compute capability, or a BackendError saying what is missing."""
    cuda = cuda or load_cudart()
    status, count = cuda.device_count()
    if status != 0 or count == 0:
        reason = f"CUDA error {status}: {cuda.error_name(status)}" if status else "the driver lists no device"
        raise BackendError(
            f"no NVIDIA GPU visible ({reason}); TensorRT and onnxruntime CUDA need an NVIDIA GPU with its driver "
            "(check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --backend cpu"
        )
    major, minor = cuda.attribute(COMPUTE_MAJOR, device), cuda.attribute(COMPUTE_MINOR, device)
    return GpuFacts(name=cuda.device_name(device), compute_capability=f"{major}.{minor}")
