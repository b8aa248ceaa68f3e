"""Branch and tree windows: several candidate continuations verified in one pass, each exactly as if alone.

A window is described by parent pointers (-1 = the committed prefix). Each entry attends to its
ancestors and itself (window_mask) and sits at position prefix + depth, so every root-to-leaf path
must give the logits, greedy ids and KV rows of running that path alone through the same graph.
"""

from __future__ import annotations

import numpy as np
import pytest
from export_helpers import hf_case, run

WINDOWS = {
    # two independent branches of 3 and 4 tokens, both starting right after the prefix
    "two-branches": [-1, 0, 1, -1, 3, 4, 5],
    # a draft tree: a root with two children, one of which has two children of its own
    "tree": [-1, 0, 0, 1, 1, 2],
    # four single-token branches (n-gram style first tokens)
    "four-roots": [-1, -1, -1, -1],
}
TOL = 1e-5


def ancestors(parents: list[int], i: int) -> list[int]:
    """Root-to-i path (window indices)."""
    path = []
    while i != -1:
        path.append(i)
        i = parents[i]
    return path[::-1]


def window_feeds(base: dict, tokens: np.ndarray, parents: list[int], past: int) -> dict:
    """Contract feeds for a window of `tokens` [B, W] shaped by `parents`, over the prefix in `base`."""
    batch, window = tokens.shape
    mask = np.zeros((window, window), bool)
    depth = np.zeros(window, np.int64)
    for i in range(window):
        path = ancestors(parents, i)
        mask[i, path] = True
        depth[i] = len(path) - 1
    kv = {k: v for k, v in base.items() if k.startswith("past_key_values.")}
    return {
        "input_ids": tokens,
        "position_ids": np.repeat((past + depth)[None], batch, 0),
        "attention_mask": np.ones((batch, past + window), np.int64),
        "window_mask": np.repeat(mask[None], batch, 0),
        **kv,
    }


@pytest.mark.parametrize("shape", list(WINDOWS), ids=list(WINDOWS))
@pytest.mark.parametrize("batch,past", [(1, 5), (2, 9), (1, 0)])
def test_each_branch_as_if_alone(exported, hf_model, ort_session, shape, batch, past):
    parents = WINDOWS[shape]
    window = len(parents)
    session = ort_session(exported.artifact)
    base = hf_case(hf_model(exported.model_dir), batch, 1, past, seed=past + batch).feeds  # a real prefix KV
    rng = np.random.default_rng(past * 10 + batch)
    tokens = rng.integers(0, exported.manifest.architecture.vocab_size, (batch, window), dtype=np.int64)

    together = run(session, window_feeds(base, tokens, parents, past))
    leaves = [i for i in range(window) if i not in parents]
    for leaf in leaves:
        path = ancestors(parents, leaf)
        alone = run(session, window_feeds(base, tokens[:, path], list(range(-1, len(path) - 1)), past))
        where = f"{shape}, path {path}"
        np.testing.assert_allclose(together["logits"][:, path], alone["logits"], atol=TOL, rtol=TOL, err_msg=where)
        assert np.array_equal(together["greedy_ids"][:, path], alone["greedy_ids"]), where
        for name in (k for k in together if k.startswith("present.")):
            both, one = together[name], alone[name]
            assert both.shape[2] == past + window and one.shape[2] == past + len(path)
            np.testing.assert_array_equal(
                both[:, :, :past],
                base[name.replace("present", "past_key_values")],
                err_msg=f"{where}: {name} prefix rows",
            )
            np.testing.assert_allclose(
                both[:, :, [past + i for i in path]], one[:, :, past:], atol=TOL, rtol=TOL, err_msg=f"{where}: {name}"
            )
