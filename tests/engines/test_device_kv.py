"""DeviceKV (the GPU backends' KV layout) on a host double: alignment, gathers, and the onnxruntime
device context driven end to end by the CPU provider, so the CUDA path's logic runs in CI."""

from __future__ import annotations

import numpy as np
import pytest
from exactness import PROMPTS, assert_cache_round_trip, assert_side_branches_stay_greedy, assert_strategies_equal_greedy
from host_memory import HostMemory

from jacobi_rt.runtime.backends.base import Backend
from jacobi_rt.runtime.backends.device_kv import ALIGN, DeviceKV, kept_runs
from jacobi_rt.runtime.backends.onnxrt import OrtBackend, OrtDeviceContext
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import load_manifest


@pytest.mark.parametrize("entry", [64, 128, 160, 256, 512])
@pytest.mark.parametrize("blocks", [1, 2, 3, 9])
def test_every_row_is_aligned_and_inside_its_side(entry, blocks):
    kv = DeviceKV(HostMemory(), rows=5, blocks=blocks, capacity=37, entry=entry)
    for side in (0, 1):
        for length in range(kv.capacity + 1):
            rows = kv.addresses(side, length)
            assert all(a % ALIGN == 0 for a in rows), (side, length)
            assert rows[-1] + blocks * length * entry <= kv.bases[side] + kv.side_bytes
            assert kv.stride(length) >= blocks * length * entry


def write_dense(kv: DeviceKV, side: int, data: np.ndarray) -> None:
    """data [rows, blocks, length, entry] uint8 -> side, in the layout of a cache of `length` entries."""
    for address, row in zip(kv.addresses(side, data.shape[2]), data):
        kv.memory.upload(address, row)


def read_dense(kv: DeviceKV, side: int, length: int) -> np.ndarray:
    return np.stack([kv.read(side, length, r).reshape(kv.blocks, length, kv.entry) for r in range(kv.rows)])


def test_gather_keeps_the_runs_in_order_with_one_copy_each():
    memory = HostMemory()
    kv = DeviceKV(memory, rows=4, blocks=3, capacity=20, entry=32)
    data = np.random.default_rng(0).integers(0, 255, (4, 3, 13, 32), dtype=np.uint8)
    write_dense(kv, 0, data)
    runs = [(0, 5), (7, 9), (12, 13)]
    assert kv.gather(0, 13, runs) == 8
    assert memory.copies == 3
    expected = np.concatenate([data[:, :, a:b] for a, b in runs], axis=2)
    np.testing.assert_array_equal(read_dense(kv, 1, 8), expected)


def test_kept_runs_merge_the_past_with_a_prefix_branch():
    assert kept_runs(4, [0, 3, 4]) == [(0, 5), (7, 9)]
    assert kept_runs(4, [0, 1, 2]) == [(0, 7)]
    assert kept_runs(0, [1, 2]) == [(1, 3)]
    assert kept_runs(0, []) == []


@pytest.fixture(scope="module")
def cpu_backend(artifact):
    folder = artifact("llama")
    return OrtBackend(folder, load_manifest(folder), device="cpu", threads=1, graph="portable")  # the graph CUDA runs


class HostDeviceBackend(Backend):
    """The CPU OrtBackend, but each context keeps its KV in a DeviceKV (host double): the CUDA path's
    binding, gathers and trims, run by onnxruntime's CPU provider."""

    def __init__(self, backend):
        self.inner, self.manifest, self.name = backend, backend.manifest, "onnxruntime-device-kv-on-host"
        self.rows = backend.rows  # its contexts pad (or not) as the inner backend's check decided

    @property
    def limits(self):
        return self.inner.limits

    def context(self, capacity, batch=1):
        return OrtDeviceContext(
            self.inner, max(1, min(capacity, self.manifest.max_context)), batch, memory=HostMemory()
        )

    def close(self):
        pass


def test_device_context_cache_round_trip(cpu_backend):
    assert_cache_round_trip(HostDeviceBackend(cpu_backend), cpu_backend, atol=1e-5)


def test_device_context_side_branches(cpu_backend):
    assert_side_branches_stay_greedy(HostDeviceBackend(cpu_backend))


def test_device_context_misuse_is_a_clear_error(cpu_backend):
    ctx = HostDeviceBackend(cpu_backend).context(8)
    ctx.forward(np.array([[1, 2]]))
    with pytest.raises(BackendError, match="outside the last window"):
        ctx.commit(3)
    for bad in ([1, 0], [0, 0], [2]):
        with pytest.raises(BackendError, match="ascending, distinct"):
            ctx.commit_rows(bad)
    with pytest.raises(BackendError, match="pending"):
        ctx.trim(0)
    ctx.commit(2)
    ctx.close()
    with pytest.raises(BackendError, match="closed"):
        ctx.forward(np.array([[1]]))
    with pytest.raises(BackendError, match="closed"):
        ctx.kv(0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_strategies_through_device_contexts_equal_cpu_greedy(artifact, family):
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder = artifact(family)
    manifest = load_manifest(folder)
    cpu = OrtBackend(folder, manifest, device="cpu", threads=1, graph="portable")
    draft_folder = artifact(f"{family}-draft1")
    draft = HostDeviceBackend(
        OrtBackend(draft_folder, load_manifest(draft_folder), device="cpu", threads=1, graph="portable")
    )
    on_device = Generator(HostDeviceBackend(cpu), Tokenizer(folder, manifest), draft=draft)
    greedy = assert_strategies_equal_greedy(on_device, new=30, draft=True)
    plain = Generator(cpu, Tokenizer(folder, manifest))
    assert greedy == [plain.generate(p, max_new_tokens=30, strategy="greedy").ids for p in PROMPTS]


def test_padded_passes_through_device_contexts_equal_cpu_greedy(artifact):
    """The pad row of exact_rows.py (a one-token pass run as two rows) through DeviceKV: its entry is
    written one past the window and dropped by commit's gather; every strategy still equals greedy."""
    from make_artifacts import TINY_GGUF

    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.tokenizer import Tokenizer

    folder = artifact(TINY_GGUF)
    manifest = load_manifest(folder)
    cpu = OrtBackend(folder, manifest, device="cpu", threads=1, graph="portable")
    padded = OrtBackend(folder, manifest, device="cpu", threads=1, graph="portable")
    padded.pad_rows = True
    greedy = assert_strategies_equal_greedy(Generator(HostDeviceBackend(padded), Tokenizer(folder, manifest)), new=30)
    if cpu.rows.mode == "native":  # a CPU whose one-row passes are exact as they come: the pad changes nothing
        plain = Generator(cpu, Tokenizer(folder, manifest))
        assert greedy == [plain.generate(p, max_new_tokens=30, strategy="greedy").ids for p in PROMPTS]
