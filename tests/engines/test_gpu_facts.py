"""The GPU's identity through libcudart, and the messages when there is no GPU (a fake library)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from jacobi_rt.runtime.backends.cuda import Cuda, GpuFacts, device_count, gpu_facts
from jacobi_rt.runtime.errors import BackendError

ERRORS = {2: b"cudaErrorMemoryAllocation", 35: b"cudaErrorInsufficientDriver", 100: b"cudaErrorNoDevice"}


def fake_cudart(status=0, count=1, name="NVIDIA H200", capability=(9, 0)):
    def get_count(ref):
        ref._obj.value = count
        return status

    def get_attribute(ref, attribute, device):
        ref._obj.value = capability[0] if attribute.value == 75 else capability[1]
        return 0

    def get_properties(buffer, device):
        ctypes.memmove(buffer, name.encode() + b"\0", len(name) + 1)
        return 0

    return SimpleNamespace(
        cudaGetDeviceCount=get_count,
        cudaDeviceGetAttribute=get_attribute,
        cudaGetDeviceProperties=get_properties,
        cudaGetErrorName=lambda s: ERRORS.get(s.value),
    )


def test_facts_of_a_visible_gpu():
    facts = gpu_facts(Cuda(fake_cudart()))
    assert facts == GpuFacts("NVIDIA H200", "9.0") and facts.sm == "sm90"
    assert gpu_facts(Cuda(fake_cudart(name="NVIDIA L4", capability=(8, 9)))).compute_capability == "8.9"


@pytest.mark.parametrize(
    "status, count, reason",
    [
        (35, 0, r"CUDA error 35: cudaErrorInsufficientDriver"),
        (100, 0, r"CUDA error 100: cudaErrorNoDevice"),
        (0, 0, r"the driver lists no device"),
    ],
)
def test_no_gpu_is_a_clear_error(status, count, reason):
    with pytest.raises(BackendError, match=rf"no NVIDIA GPU visible \({reason}\).*nvidia-smi"):
        gpu_facts(Cuda(fake_cudart(status, count)))


def test_cuda_errors_name_the_call():
    with pytest.raises(BackendError, match=r"CUDA error 2 \(cudaErrorMemoryAllocation\) in cudaMalloc"):
        Cuda(fake_cudart()).check(2, "cudaMalloc")


@pytest.mark.skipif(device_count() > 0, reason="this machine has a GPU")
def test_this_machine_without_a_gpu_says_so():
    with pytest.raises(BackendError, match="no NVIDIA GPU visible|no CUDA runtime library"):
        gpu_facts()
