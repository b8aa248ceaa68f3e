"""PassResult: the loop times the target's forward once and hands one result per pass to the proposer and the policy."""

from __future__ import annotations

import itertools

import pytest
from alone import decode
from recording import Recording, RecordingWindow

from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.passes import pass_result
from jacobi_rt.runtime.tree import build_tree


def test_pass_result_defaults_to_a_pass_of_the_row_alone():
    tree = build_tree(3, [[4, 5], [6]])
    result = pass_result(tree, [4, 5, 9, 1], tree.accept([4, 5, 9, 1]), 0.02)
    assert (result.rows, result.width, result.window) == (1, 4, 4) and result.committed == [4, 5, 9]
    batched = pass_result(tree, [0] * 4, tree.accept([0] * 4), 0.02, rows=16, width=8)
    assert (batched.rows, batched.width, batched.window) == (16, 8, 4)  # a batched pass's shape


def test_the_loop_times_only_the_forward_and_gives_the_proposer_and_the_policy_the_same_result(artifact):
    path = artifact("llama")
    ticks = itertools.count()
    clock = lambda: next(ticks) * 0.01  # every reading 10 ms later: a forward bracketed once reads 10 ms
    proposer, policy = Recording(), RecordingWindow(4)
    with OrtBackend(path, load_manifest(path), "cpu", 1) as backend, backend.context(64) as ctx:
        _, passes = decode(ctx, [5, 17, 42, 8], proposer, policy, 20, chunk=16, clock=clock)
    new = [t for batch in passes[1:] for t in batch]
    assert proposer.results and proposer.results == policy.results  # one result per pass, to both
    assert [r.seconds for r in proposer.results] == pytest.approx(
        [0.01] * len(proposer.results)
    )  # a reading before and after the forward, nothing else
    assert all(r.window == r.width == len(r.tree.tokens) and r.rows == 1 for r in proposer.results)
    assert [t for r in proposer.results for t in r.committed] == new[: sum(len(r.committed) for r in proposer.results)]


def test_the_loop_teaches_each_distinct_cost_curve_once_per_pass(artifact):
    from jacobi_rt.runtime.acceptance import AcceptanceTracker, PassCosts
    from jacobi_rt.runtime.proposers import LookaheadProposer, UnionProposer

    shared, own = PassCosts(), PassCosts()
    union = UnionProposer(
        {
            "a": LookaheadProposer(1, AcceptanceTracker(shared)),
            "b": LookaheadProposer(1, AcceptanceTracker(shared)),
            "c": LookaheadProposer(1, AcceptanceTracker(own)),
        }
    )
    path = artifact("llama")
    ticks = itertools.count()
    with OrtBackend(path, load_manifest(path), "cpu", 1) as backend, backend.context(64) as ctx:
        row, _ = decode(ctx, [5, 17, 42, 8, 5, 17, 42], union, 4, 20, chunk=16, clock=lambda: next(ticks) * 0.01)
    progress = row.progress
    assert (
        sum(shared.samples.values()) == sum(own.samples.values()) == progress.target_passes
    )  # not twice for a shared one
