"""Masked picks (runtime/sampling.py): the greedy and seeded Gumbel rules over the tokens a constraint
allows, with the unconstrained noise g(s, t, i), so a constrained pick is a function of the prefix."""

from __future__ import annotations

import numpy as np
import pytest

from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.sampling import Sampler, SamplingParams, gumbel, masked_greedy, survivors

VOCAB = 3000  # over the 1,024 survivors where the noise switches to numpy's C stream


def logits_and_mask(seed: int, allowed_share: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
    allowed = rng.random(VOCAB) < allowed_share
    allowed[rng.integers(VOCAB)] = True
    return logits, allowed


def test_masked_greedy_is_the_most_likely_allowed_token():
    logits = np.array([0.0, 5.0, 3.0, 3.0, -1.0], dtype=np.float32)
    assert masked_greedy(logits, 1, np.array([1, 1, 1, 1, 1], bool)) == 1  # the in-graph id, when allowed
    assert masked_greedy(logits, 1, np.array([1, 0, 1, 1, 0], bool)) == 2  # ties: the first, as ArgMax
    assert masked_greedy(logits, 1, np.array([0, 0, 0, 0, 1], bool)) == 4  # a worse token, if it is all there is
    with pytest.raises(InputError):
        masked_greedy(logits, 1, np.zeros(5, bool))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(temperature=1.3, top_k=40, seed=12),
        SamplingParams(temperature=0.7, top_p=0.9, seed=13),
        SamplingParams(temperature=1.0, min_p=0.05, seed=14),
        SamplingParams(temperature=0.05, seed=15),  # low temperature: the pruned noise path
    ],
)
def test_every_token_allowed_is_the_unconstrained_pick(params):
    sampler = Sampler(params, prompt_len=3)
    for t in range(20):
        logits, _ = logits_and_mask(t, 1.0)
        assert sampler.sample(logits, [1, 2, 3], 100 + t, np.ones(VOCAB, bool)) == sampler.sample(
            logits, [1, 2, 3], 100 + t
        )


@pytest.mark.parametrize("share", [0.001, 0.1, 0.9])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, seed=21),
        SamplingParams(temperature=1.1, top_k=20, top_p=0.8, seed=22),
        SamplingParams(temperature=0.6, min_p=0.1, seed=23, repetition_penalty=1.3, presence_penalty=0.5),
    ],
)
def test_a_masked_pick_is_gumbel_max_over_the_filtered_allowed_tokens(params, share):
    """Written out the long way: penalties, temperature, the filters over the allowed tokens only,
    then argmax of z + g(s, t, i) with the whole vocabulary's noise stream indexed by token id."""
    sampler = Sampler(params, prompt_len=2)
    prefix = [5, 9, 9, 40]
    for t in range(15):
        logits, allowed = logits_and_mask(100 + t, share)
        z = sampler.penalised(logits, prefix) / params.temperature
        ids = np.flatnonzero(allowed)
        kept = survivors(z[ids], params.top_k, params.top_p, params.min_p)
        ids = ids if kept is None else ids[kept]
        noise = gumbel(params.seed, 50 + t, None, VOCAB)
        expected = int(ids[np.argmax(z[ids] + noise[ids])])
        got = sampler.sample(logits, prefix, 50 + t, allowed)
        assert got == expected and allowed[got]


def test_greedy_with_penalties_masks_after_penalising():
    sampler = Sampler(SamplingParams(repetition_penalty=10.0), prompt_len=0)
    logits = np.array([1.0, 4.0, 3.0, 2.0], dtype=np.float32)
    allowed = np.array([1, 1, 1, 0], bool)
    assert sampler.sample(logits, [1], 1, allowed) == 2  # token 1's 4.0 becomes 0.4
