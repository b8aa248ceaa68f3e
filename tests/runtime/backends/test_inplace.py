"""OrtInplaceContext: one cache buffer bound as past and present; commits move lengths, not the cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jacobi_rt.runtime.backends.inplace import OrtInplaceContext
from jacobi_rt.runtime.backends.onnxrt import OrtBackend, OrtContext, _pick_graph
from jacobi_rt.runtime.errors import BackendError
from jacobi_rt.runtime.manifest import load_manifest

FAMILIES = ["llama", "llama-mha-tied", "mistral", "qwen2", "qwen3", "gpt2"]
PREFIX = [5, 17, 33, 90]
# a tree window: root 7, then the branches (11, 12) and (40, 41, 42)
TREE = [7, 11, 12, 40, 41, 42]
TREE_MASK = np.array(
    [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 1, 1, 1],
    ],
    dtype=bool,
)
TREE_DEPTHS = np.array([0, 1, 2, 1, 2, 3])


@pytest.fixture(scope="module")
def backends(artifact):
    """backends(family) -> (in-place, portable) OrtBackends of one artifact, 1 thread each."""
    loaded = {}

    def get(family: str):
        if family not in loaded:
            folder = artifact(family)
            manifest = load_manifest(folder)
            loaded[family] = tuple(OrtBackend(folder, manifest, "cpu", 1, graph=g) for g in ("inplace", "portable"))
        return loaded[family]

    return get


def prefill(backend, tokens, capacity=32):
    ctx = backend.context(capacity)
    ctx.forward(np.array([tokens]))
    ctx.commit(len(tokens))
    return ctx


def assert_same_cache(ctx, fresh, layers):
    assert ctx.length == fresh.length
    for layer in range(layers):
        for kind in ("key", "value"):
            np.testing.assert_allclose(ctx.kv(layer, kind), fresh.kv(layer, kind), atol=1e-5)


def test_cpu_picks_the_inplace_graph_and_portable_can_be_forced(backends):
    inplace, portable = backends("llama")
    assert (inplace.graph, portable.graph) == ("inplace", "portable")
    with inplace.context(8) as a, portable.context(8) as b:
        assert isinstance(a, OrtInplaceContext) and isinstance(b, OrtContext)


def test_auto_is_inplace_on_cpu(artifact):
    folder = artifact("llama")
    assert OrtBackend(folder, load_manifest(folder), "cpu", 1).graph == "inplace"


@pytest.mark.parametrize(
    "quantization, weights, graph, branches",
    [
        (
            "gguf",
            {"accuracy_level": 4},
            "portable",
            False,
        ),  # int8 activations: this in-place graph is not window-consistent
        (
            "gguf",
            {"accuracy_level": 4, "attention_extra_row": True},
            "inplace",
            False,
        ),  # exact with the extra row (gqa_rows.py)
        ("int4", {"accuracy_level": 4}, "portable", False),
        ("int8", None, "portable", False),  # an artifact from before the weight pass recorded its level (level 4 then)
        ("gguf", {"accuracy_level": 0}, "inplace", True),  # float activations: the in-place graph stays exact
    ],
)
def test_auto_runs_the_inplace_graph_only_where_it_is_exact(artifact, quantization, weights, graph, branches):
    """The choice on manifests of quantized exports (the weight pass's word on the extra row alone: as a float
    trace made them before it gave the row itself); loads only on a manifest true to the graph (its spare entry)."""
    folder = artifact("llama")
    manifest = load_manifest(folder)
    older = {**manifest.check, "inplace": {**manifest.check["inplace"], "extra_row": False}}
    quantized = dataclasses.replace(manifest, quantization=quantization, check={**older, "weights": weights or {}})
    assert _pick_graph(quantized, "auto", "cpu") == graph
    assert _pick_graph(quantized, "inplace", "cpu") == "inplace"  # asked for, it is given
    true = dataclasses.replace(quantized, check={**quantized.check, "inplace": manifest.check["inplace"]})
    assert OrtBackend(folder, true, "cpu", 1).limits.branches is branches  # level 4: one chain a pass


def test_an_artifact_without_the_inplace_graph_loads_the_portable_one(artifact):
    folder = artifact("llama")
    old = dataclasses.replace(load_manifest(folder), graphs={"portable": "model.onnx"})  # an artifact from before
    assert OrtBackend(folder, old, "cpu", 1).graph == "portable"
    with pytest.raises(BackendError, match="no in-place graph"):
        OrtBackend(folder, old, "cpu", 1, graph="inplace")
    with pytest.raises(BackendError, match="graph must be"):
        OrtBackend(folder, old, "cpu", 1, graph="fast")


@pytest.mark.parametrize("family", FAMILIES)
def test_commit_and_a_side_branch_gather_equal_a_fresh_prefill(backends, family):
    inplace, portable = backends(family)
    layers = inplace.manifest.architecture.num_layers
    with prefill(inplace, PREFIX) as ctx:
        ctx.forward(np.array([[11, 12, 13, 14]]))  # keep two of four
        ctx.commit(2)
        with prefill(inplace, PREFIX + [11, 12]) as fresh:
            assert_same_cache(ctx, fresh, layers)
        ctx.trim(len(PREFIX))
        ctx.forward(np.array([TREE]), positions=ctx.length + TREE_DEPTHS[None], window_mask=TREE_MASK[None])
        ctx.commit_rows([0, 3, 4])  # the second branch: at most W rows move, per layer
        kept = PREFIX + [7, 40, 41]
        with prefill(inplace, kept) as fresh, prefill(portable, kept) as reference:
            assert_same_cache(ctx, fresh, layers)
            assert_same_cache(ctx, reference, layers)
            got = ctx.forward(np.array([[42]]), want_logits=True)
            want = reference.forward(np.array([[42]]), want_logits=True)
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-4)
        assert (got.greedy_ids == want.greedy_ids).all()


def test_each_row_of_a_batch_has_its_own_length(backends):
    inplace, _ = backends("qwen2")
    prompts = np.array([[5, 17, 33, 90, 100, 7], [8, 9, 10, 11, 12, 13]])
    window = np.array([[7, 11, 12, 40, 41, 42], [21, 22, 23, 22, 23, 24]])
    with inplace.context(40, batch=2) as ctx:
        ctx.forward(prompts)
        ctx.commit_each([[0, 1, 2], list(range(6))])  # row 0 keeps 3 entries, row 1 all 6
        assert ctx.lengths.tolist() == [3, 6]
        with pytest.raises(BackendError, match="different lengths"):
            ctx.length
        positions = ctx.lengths[:, None] + TREE_DEPTHS[None]
        both = ctx.forward(window, positions=positions, window_mask=np.stack([TREE_MASK, TREE_MASK]), want_logits=True)
        for row, length in enumerate([3, 6]):
            with prefill(inplace, prompts[row, :length].tolist()) as alone:
                one = alone.forward(
                    window[row : row + 1],
                    positions=length + TREE_DEPTHS[None],
                    window_mask=TREE_MASK[None],
                    want_logits=True,
                )
            np.testing.assert_allclose(both.logits[row], one.logits[0], atol=1e-4)
            assert (both.greedy_ids[row] == one.greedy_ids[0]).all()
        ctx.commit_rows([0, 3], row=1)  # only row 1 keeps a side branch
        assert ctx.lengths.tolist() == [3, 8]
        with prefill(inplace, prompts[1].tolist() + [21, 22]) as alone:
            for layer in range(inplace.manifest.architecture.num_layers):
                np.testing.assert_allclose(ctx.kv(layer, "value", row=1), alone.kv(layer, "value"), atol=1e-5)
        ctx.trim_row(0, 2)
        ctx.trim_row(1, 5)
        assert ctx.lengths.tolist() == [2, 5]
        with pytest.raises(BackendError, match="outside"):
            ctx.trim(3)  # every row to 3: row 0 has only 2


def test_logits_can_be_asked_for_then_not_then_again(backends):
    inplace, portable = backends("llama")
    with prefill(inplace, PREFIX) as ctx, prefill(portable, PREFIX) as ref:
        for want in (True, False, True):
            got, expected = (
                ctx.forward(np.array([[7, 8]]), want_logits=want),
                ref.forward(np.array([[7, 8]]), want_logits=True),
            )
            assert (got.logits is not None) == want
            if want:
                np.testing.assert_allclose(got.logits, expected.logits, atol=1e-4)
            assert (got.greedy_ids == expected.greedy_ids).all()
            ctx.commit(1)
            ref.commit(1)


def test_the_capacity_does_not_change_the_result(backends):
    inplace, _ = backends("llama")
    outs = []
    for capacity in (12, 200):
        with prefill(inplace, PREFIX, capacity) as ctx:
            outs.append(ctx.forward(np.array([[7, 8, 9]]), want_logits=True).logits)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)  # the unused tail is masked out, whatever it holds


def test_context_misuse_is_a_clear_error(backends):
    inplace, _ = backends("llama")
    with inplace.context(8) as ctx:
        with pytest.raises(BackendError, match="capacity"):
            ctx.forward(np.zeros((1, 9), np.int64))
        ctx.forward(np.zeros((1, 2), np.int64))
        with pytest.raises(BackendError, match="commit"):
            ctx.forward(np.zeros((1, 1), np.int64))
        with pytest.raises(BackendError, match="outside"):
            ctx.commit(3)
        with pytest.raises(BackendError, match="ascending"):
            ctx.commit_rows([1, 0])
        ctx.commit(1)
        with pytest.raises(BackendError, match="outside"):
            ctx.trim(2)
    with pytest.raises(BackendError, match="closed"):
        ctx.forward(np.zeros((1, 1), np.int64))


def test_a_selected_range_of_rows_runs_alone_and_each_row_commits_its_own(backends):
    """select(start, stop) binds a contiguous block of rows; commit_each keeps each row's own entries;
    move_row packs a row into another slot. Each row equals that row run alone."""
    inplace, _ = backends("llama")
    prompts = [[5, 17, 33, 90], [8, 9, 10, 11], [21, 22, 23, 24]]
    with inplace.context(40, batch=4) as ctx:
        ctx.select(1, 4)  # slot 0 stays idle
        ctx.forward(np.array(prompts))
        ctx.commit_each([[0, 1, 2, 3], [0, 1], []])
        assert ctx.lengths.tolist() == [0, 4, 2, 0]
        ctx.select(1, 3)
        out = ctx.forward(
            np.array([TREE, TREE]),
            positions=ctx.lengths[1:3, None] + TREE_DEPTHS[None],
            window_mask=np.stack([TREE_MASK, TREE_MASK]),
        )
        ctx.commit_each([[0, 3, 4], [0, 1]])  # row 1 an accepted side branch, row 2 a prefix
        assert ctx.lengths.tolist() == [0, 7, 4, 0]
        for row, kept, before in ((1, [7, 40, 41], prompts[0]), (2, [7, 11], prompts[1][:2])):
            with prefill(inplace, before) as alone:
                alone_out = alone.forward(
                    np.array([TREE]), positions=len(before) + TREE_DEPTHS[None], window_mask=TREE_MASK[None]
                )
                assert (alone_out.greedy_ids[0] == out.greedy_ids[row - 1]).all()
            with prefill(inplace, before + kept) as fresh:
                for layer in range(inplace.manifest.architecture.num_layers):
                    np.testing.assert_allclose(ctx.kv(layer, "key", row=row), fresh.kv(layer, "key"), atol=1e-5)
        ctx.move_row(2, 0)
        assert ctx.lengths.tolist() == [4, 7, 0, 0]
        with prefill(inplace, prompts[1][:2] + [7, 11]) as fresh:
            np.testing.assert_allclose(ctx.kv(0, "value", row=0), fresh.kv(0, "value"), atol=1e-5)
        with pytest.raises(BackendError, match="outside"):
            ctx.select(2, 5)
        with pytest.raises(BackendError, match="one list"):
            ctx.select(0, 2)
            ctx.forward(np.array([[1], [2]]))
            ctx.commit_each([[0]])


def test_a_large_cache_costs_memory_only_where_it_is_written():
    """One token in each 2 MB block (a head's rows at capacity 8192) must not fault in whole huge pages."""
    from jacobi_rt.runtime.backends.inplace import zeroed_pages

    def resident_mb() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2**20

    before = resident_mb()
    kv = zeroed_pages((64, 8192, 64), np.float32)  # 128 MB of address space, zeroed
    kv[:, 0, :] = 1.0  # one token per block
    assert kv.sum() == 64 * 64 and not kv[:, 1:].any()
    assert resident_mb() - before < 16  # 64 blocks x 4 KB, not 64 x 2 MB
