"""Allocations that fail half-way free what they took, and close() frees everything even when one
free fails: DeviceKV, the onnxruntime device context, TrtContext (on a host stand-in for CUDA) and a
generation whose draft or target context cannot be opened."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from host_memory import HostCuda, HostMemory
from manifests import manifest

from jacobi_rt.runtime.backends.base import Backend
from jacobi_rt.runtime.backends.device_kv import DeviceKV
from jacobi_rt.runtime.backends.onnxrt import OrtBackend, OrtDeviceContext
from jacobi_rt.runtime.backends.tensorrt import TrtContext
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.spec import kv_inputs

OUT_OF_MEMORY = "cudaErrorMemoryAllocation"


def test_device_kv_frees_its_first_side_when_the_second_does_not_fit():
    memory = HostMemory(fail_alloc=2)
    with pytest.raises(BackendError, match=OUT_OF_MEMORY):
        DeviceKV(memory, rows=4, blocks=3, capacity=16, entry=64)
    assert memory.buffers == {}


def test_device_kv_free_releases_both_sides_when_one_free_fails():
    memory = HostMemory()
    kv = DeviceKV(memory, rows=2, blocks=1, capacity=8, entry=64)
    memory.fail_free = {kv.bases[0]}
    with pytest.raises(BackendError, match="cudaFree"):
        kv.free()
    assert list(memory.buffers) == [*memory.fail_free]  # only the one CUDA would not free


@pytest.fixture(scope="module")
def cpu_backend(artifact):
    folder = artifact("llama")
    return OrtBackend(folder, load_manifest(folder), device="cpu", threads=1, graph="portable")


@pytest.mark.parametrize("failing", [1, 2])
def test_ort_device_context_frees_its_cache_when_an_allocation_fails(cpu_backend, failing):
    memory = HostMemory(fail_alloc=failing)
    with pytest.raises(BackendError, match=OUT_OF_MEMORY):
        OrtDeviceContext(cpu_backend, 16, 1, memory=memory)
    assert memory.buffers == {}


def trt_backend(memory: HostMemory, layers: int = 2):
    """What TrtContext reads from its TrtBackend, with CUDA on host memory (no engine is run)."""
    names = [t.name for t in kv_inputs(layers)]
    return SimpleNamespace(
        manifest=manifest(layers=layers),
        cuda=HostCuda(memory),
        max_window=8,
        _lock=threading.Lock(),
        dtypes={**{n: np.dtype(np.float16) for n in names}, "greedy_ids": np.dtype(np.int64)},
        engine=SimpleNamespace(create_execution_context=lambda: object()),
    )


def test_trt_context_allocates_eight_buffers():
    memory = HostMemory()
    backend = trt_backend(memory)
    ctx = TrtContext(backend, 64, 1)
    assert memory.allocations == 8 and len(backend.cuda.streams) == 1
    ctx.close()
    assert memory.buffers == {} and backend.cuda.streams == set()


@pytest.mark.parametrize("failing", range(1, 9))
def test_trt_context_frees_everything_when_any_allocation_fails(failing):
    memory = HostMemory(fail_alloc=failing)
    backend = trt_backend(memory)
    with pytest.raises(BackendError, match=OUT_OF_MEMORY):
        TrtContext(backend, 64, 1)
    assert memory.buffers == {} and backend.cuda.streams == set()


def test_trt_context_close_frees_the_rest_when_one_free_fails():
    memory = HostMemory()
    backend = trt_backend(memory)
    ctx = TrtContext(backend, 64, 1)
    bad = ctx._device[0]
    memory.fail_free = {bad}
    with pytest.raises(BackendError, match="cudaFree"):
        ctx.close()
    assert list(memory.buffers) == [bad] and backend.cuda.streams == set()
    ctx.close()  # a second close has nothing left to free


class HostKVBackend(Backend):
    """The CPU backend with each context's cache in a DeviceKV on its own HostMemory (all recorded);
    `fail_alloc` makes each new context's n-th allocation fail."""

    def __init__(self, inner: OrtBackend, fail_alloc: int | None = None):
        self.inner, self.manifest, self.name = inner, inner.manifest, "host-kv"
        self.fail_alloc = fail_alloc
        self.memories: list[HostMemory] = []

    def context(self, capacity: int, batch: int = 1):
        self.memories.append(HostMemory(self.fail_alloc))
        return OrtDeviceContext(
            self.inner, max(1, min(capacity, self.manifest.max_context)), batch, memory=self.memories[-1]
        )


@pytest.mark.parametrize("strategy", ["speculative", "auto"])
def test_a_generation_whose_target_context_fails_leaves_no_draft_cache(artifact, cpu_backend, strategy):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder = artifact("llama")
    target, draft = HostKVBackend(cpu_backend, fail_alloc=2), HostKVBackend(cpu_backend)
    generator = Generator(target, Tokenizer(folder, cpu_backend.manifest), draft=draft)
    with pytest.raises(BackendError, match=OUT_OF_MEMORY):
        generator.generate("The quick brown fox", max_new_tokens=8, strategy=strategy)
    assert all(m.buffers == {} for m in target.memories + draft.memories)


def test_a_generation_whose_draft_context_fails_frees_the_target_cache(artifact, cpu_backend):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder = artifact("llama")
    target, draft = HostKVBackend(cpu_backend), HostKVBackend(cpu_backend, fail_alloc=2)
    generator = Generator(target, Tokenizer(folder, cpu_backend.manifest), draft=draft)
    with pytest.raises(BackendError, match=OUT_OF_MEMORY):
        generator.generate("The quick brown fox", max_new_tokens=8, strategy="speculative")
    assert target.memories and all(m.buffers == {} for m in target.memories + draft.memories)
    draft.fail_alloc = None
    ok = generator.generate("The quick brown fox", max_new_tokens=8, strategy="speculative")  # still usable
    assert len(ok.ids) == 8 and len(generator.lone_cache.kept) == 1  # its context and draft cache kept
    generator.close()
    assert all(m.buffers == {} for m in target.memories + draft.memories)
