"""OrtBackend on the portable graph: the resident KV cache (forward / commit / trim) matches full-sequence passes."""

from __future__ import annotations

import numpy as np
import pytest

from jacobi_rt.runtime.backends.onnxrt import OrtBackend, physical_cores
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import load_manifest


@pytest.fixture(scope="module")
def backend(artifact):
    folder = artifact("llama")
    return OrtBackend(
        folder, load_manifest(folder), device="cpu", threads=1, graph="portable"
    )  # test_inplace.py: the other


def full_pass(backend, seq):
    """Reference: the whole sequence in one pass, with session.run and no cache."""
    arch = backend.manifest.architecture
    n = len(seq)
    feeds = {
        "input_ids": np.array([seq]),
        "position_ids": np.arange(n)[None],
        "attention_mask": np.ones((1, n), np.int64),
        "window_mask": np.tril(np.ones((n, n), bool))[None],
    }
    for i in range(arch.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, arch.kv_heads, 0, arch.head_dim), np.float32)
    logits, greedy, *present = backend.session.run(None, feeds)
    return logits, greedy, present


def test_forward_commit_trim_round_trip(backend):
    seq = [5, 17, 33, 90, 100, 7, 11, 12, 50, 51]
    with backend.context(32) as ctx:
        ctx.forward(np.array([seq[:6]]))
        ctx.commit(6)
        ctx.forward(np.array([[11, 12, 13, 14]]))  # keep two of four
        ctx.commit(2)
        assert ctx.length == 8
        _, _, present = full_pass(backend, seq[:8])
        for layer in range(backend.manifest.architecture.num_layers):
            np.testing.assert_allclose(ctx.kv(layer, "key"), present[2 * layer], atol=1e-5)
            np.testing.assert_allclose(ctx.kv(layer, "value"), present[2 * layer + 1], atol=1e-5)
        out = ctx.forward(np.array([[50, 51]]), want_logits=True)
        ctx.commit(2)
        logits, greedy, _ = full_pass(backend, seq)
        np.testing.assert_allclose(out.logits, logits[:, -2:], atol=1e-4)
        assert (out.greedy_ids == greedy[:, -2:]).all()
        ctx.trim(7)  # rewind, then redo the 8th token
        out = ctx.forward(np.array([[12]]), want_logits=True)
        ctx.commit(1)
        logits, _, _ = full_pass(backend, seq[:8])
        np.testing.assert_allclose(out.logits, logits[:, -1:], atol=1e-4)


def test_commit_rows_keeps_a_branch(backend):
    prefix = [5, 17, 33, 90]
    with backend.context(32) as ctx:
        ctx.forward(np.array([prefix]))
        ctx.commit(4)
        # a tree window: root 7, then two branches (11, 12) and (40, 41, 42); the second one is kept
        tree = [7, 11, 12, 40, 41, 42]
        mask = np.array(
            [
                [1, 0, 0, 0, 0, 0],
                [1, 1, 0, 0, 0, 0],
                [1, 1, 1, 0, 0, 0],
                [1, 0, 0, 1, 0, 0],
                [1, 0, 0, 1, 1, 0],
                [1, 0, 0, 1, 1, 1],
            ],
            dtype=bool,
        )[None]
        positions = np.array([[4, 5, 6, 5, 6, 7]])
        ctx.forward(np.array([tree]), positions=positions, window_mask=mask)
        ctx.commit_rows([0, 3, 4])
        assert ctx.length == 7
        _, _, present = full_pass(backend, prefix + [7, 40, 41])
        for layer in range(backend.manifest.architecture.num_layers):
            np.testing.assert_allclose(ctx.kv(layer, "key"), present[2 * layer], atol=1e-5)
            np.testing.assert_allclose(ctx.kv(layer, "value"), present[2 * layer + 1], atol=1e-5)
        out = ctx.forward(np.array([[42]]), want_logits=True)
        ctx.commit(1)
        logits, _, _ = full_pass(backend, prefix + [7, 40, 41, 42])
        np.testing.assert_allclose(out.logits, logits[:, -1:], atol=1e-4)


def test_context_misuse_is_a_clear_error(backend):
    with backend.context(8) as ctx:
        with pytest.raises(BackendError, match="capacity"):
            ctx.forward(np.zeros((1, 9), np.int64))
        ctx.forward(np.zeros((1, 2), np.int64))
        with pytest.raises(BackendError, match="commit"):
            ctx.forward(np.zeros((1, 1), np.int64))
        with pytest.raises(BackendError, match="outside"):
            ctx.commit(3)
        ctx.commit(1)
    with pytest.raises(BackendError, match="closed"):
        ctx.forward(np.zeros((1, 1), np.int64))


def test_cuda_asked_without_cuda_is_a_clear_error(artifact):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed: CUDA may be available here")
    folder = artifact("llama")
    with pytest.raises(BackendError, match="--backend cpu"):
        OrtBackend(folder, load_manifest(folder), device="cuda")


def test_physical_cores_is_positive():
    assert physical_cores() >= 1
