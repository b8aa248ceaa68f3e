"""Checks shared by the device-KV tests (host double) and the GPU tests (TensorRT, onnxruntime CUDA):
the KV cache survives forward/commit/commit_rows/trim, and every strategy equals greedy decoding of
the same backend token for token."""

from __future__ import annotations

import numpy as np
from alone import tokens

from jacobi_rt.runtime.allocator import Guess, Offer
from jacobi_rt.runtime.proposers import NoProposer, Proposer

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Numbers 0 1 2 3 4 5 6 7",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
]


def straight_kv(backend, seq: list[int]) -> list[np.ndarray]:
    """Every layer's key and value after one prefill of `seq` on `backend` (the reference cache)."""
    with backend.context(len(seq) + 1) as ctx:
        ctx.forward(np.array([seq]))
        ctx.commit(len(seq))
        layers = backend.manifest.architecture.num_layers
        return [ctx.kv(i, kind).copy() for i in range(layers) for kind in ("key", "value")]


def assert_kv(ctx, expected: list[np.ndarray], atol: float) -> None:
    layers = len(expected) // 2
    got = [ctx.kv(i, kind) for i in range(layers) for kind in ("key", "value")]
    for row, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=atol, err_msg=f"KV row {row}")


def assert_cache_round_trip(backend, reference, atol: float = 1e-5, logit_atol: float = 1e-4) -> None:
    """forward/commit (part of a window)/trim/commit_rows (a side branch) leave the cache equal to a
    straight prefill of the kept tokens (computed on `reference`), and the next pass agrees."""
    seq = [5, 17, 33, 90, 100, 7, 11, 12, 50, 51]
    with backend.context(32) as ctx:
        ctx.forward(np.array([seq[:6]]))
        ctx.commit(6)
        ctx.forward(np.array([[11, 12, 13, 14]]))
        ctx.commit(2)  # keep two of four
        assert ctx.length == 8
        assert_kv(ctx, straight_kv(reference, seq[:8]), atol)
        ctx.trim(7)
        assert_kv(ctx, straight_kv(reference, seq[:7]), atol)
        # a tree window: root 12, then branches (13, 14) and (40, 41, 42); keep the second
        tree = [12, 13, 14, 40, 41, 42]
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
        ctx.forward(np.array([tree]), positions=np.array([[7, 8, 9, 8, 9, 10]]), window_mask=mask)
        ctx.commit_rows([0, 3, 4])
        kept = seq[:7] + [12, 40, 41]
        assert ctx.length == len(kept)
        assert_kv(ctx, straight_kv(reference, kept), atol)
        out = ctx.forward(np.array([[42]]), want_logits=True)
        ctx.commit(1)
    with reference.context(32) as ref:
        full = ref.forward(np.array([kept + [42]]), want_logits=True)
    last = full.logits[0, -1]
    np.testing.assert_allclose(out.logits[0, -1], last, atol=logit_atol)
    second, first = np.sort(last)[-2:]
    if first - second > 2 * logit_atol:  # not a near-tie
        assert out.greedy_ids[0, -1] == full.greedy_ids[0, -1]


class BranchOracle(Proposer):
    """Two branches a pass, the wrong one first, so the accepted branch is never the window's prefix
    and its KV must be gathered (commit_rows)."""

    def __init__(self, truth: list[int], vocab: int):
        super().__init__()
        self.truth, self.vocab, self.done, self.gathers = truth, vocab, 0, 0

    def start(self, prompt, first):
        self.done = 1

    def offer(self, limit, after=()):
        right = self.truth[self.done : self.done + 3]
        self.offered = [[(t + 1) % self.vocab for t in right], right] if right else []
        return Offer(tuple(Guess((1.0,) * len(g), tuple(g)) for g in self.offered), fixed=True)

    def observe(self, result):
        self.gathers += not result.verdict.contiguous
        self.done += len(result.committed)


def assert_side_branches_stay_greedy(backend, new: int = 40) -> None:
    prompt = [5, 17, 42, 8, 99, 23]

    def run(proposer, window):
        with backend.context(64) as ctx:
            return tokens(ctx, prompt, proposer, window, new)

    truth = run(NoProposer(), 1)
    oracle = BranchOracle(truth, backend.manifest.architecture.vocab_size)
    assert run(oracle, 8) == truth
    assert oracle.gathers >= 5


def assert_strategies_equal_greedy(gen, prompts=PROMPTS, new: int = 40, draft: bool = False) -> list[list[int]]:
    """Every strategy's ids equal greedy's on `gen`; returns greedy's ids per prompt."""
    strategies = [("jacobi", 4), ("jacobi", 16), ("jacobi", None), ("lookahead", None), ("lookahead", 16)]
    if draft:
        strategies += [("speculative", None), ("auto", None)]
    out = []
    for prompt in prompts:
        request = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}  # chat messages or text
        greedy = gen.generate(max_new_tokens=new, strategy="greedy", **request).ids
        for strategy, window in strategies:
            ids = gen.generate(max_new_tokens=new, strategy=strategy, window=window, **request).ids
            assert ids == greedy, (prompt, strategy, window, first_difference(greedy, ids))
        out.append(greedy)
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
