"""The sampler: its noise is numpy's Philox, its draws follow the filtered softmax, its filters and
penalties are the documented ones, and bad parameters are clear errors."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.sampling import Sampler, SamplingParams, gumbel, philox_raw, survivors

# --- the noise ---------------------------------------------------------------------------------


# one generator per token, vectorised, and numpy's C stream
@pytest.mark.parametrize("ids", [np.array([5, 49151]), np.array([0, 1, 2, 3, 4, 7, 400, 49151]), np.arange(5000)])
def test_noise_is_numpys_philox_keyed_by_seed_position_and_token(ids):
    seed, position = 2**63 + 12345, 77
    stream = np.random.Philox(
        key=np.array([seed, 0], dtype=np.uint64), counter=np.array([0, position, 0, 0], dtype=np.uint64)
    )
    expected = stream.random_raw(49152)[ids]
    assert (philox_raw(seed, position, ids) == expected).all()
    assert (philox_raw(seed, position + 1, ids) != expected).mean() > 0.99  # another position, other noise


def test_noise_of_a_token_does_not_depend_on_which_tokens_are_drawn():
    few = gumbel(9, 3, np.array([5, 1000, 30000]))
    many = gumbel(9, 3, np.arange(40000))
    assert np.array_equal(few, many[[5, 1000, 30000]])


# --- the draws follow the filtered softmax -------------------------------------------------------

LOGITS = np.array([2.0, 1.6, 1.3, 1.0, 0.8, 0.5, 0.2, 0.0, -0.3, -0.6, -1.0, -1.5], dtype=np.float32)
DRAWS = 4000


def filtered_softmax(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Written from the definition: softmax(logits / T), keep the most likely until top_p is reached."""
    probs = np.exp(logits / temperature - np.max(logits / temperature))
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]
    out = np.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


def chi_square(sampler: Sampler, expected: np.ndarray) -> float:
    counts = np.zeros(len(expected))
    for seed in range(DRAWS):
        sampler.params = replace(sampler.params, seed=seed)
        counts[sampler.sample(LOGITS, [1, 2, 3], 7)] += 1
    if (counts[expected == 0] > 0).any():
        return math.inf  # a token the filter removed was drawn
    keep = expected > 0
    want = expected[keep] * DRAWS
    return float(((counts[keep] - want) ** 2 / want).sum())


def chi_square_bound(df: int, z: float = 4.265) -> float:
    """The chi-square quantile at p = 1e-5 (Wilson-Hilferty): a right sampler exceeds it 1 time in 100,000."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("temperature, top_p", [(0.5, 0.8), (1.0, 1.0), (1.5, 0.6)])
def test_draws_match_the_filtered_softmax_and_a_wrong_sampler_fails(temperature, top_p):
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=0)
    expected = filtered_softmax(LOGITS.astype(np.float64), temperature, top_p)
    bound = chi_square_bound(int((expected > 0).sum()) - 1)
    assert chi_square(Sampler(params, prompt_len=3), expected) < bound
    # the test can fail: a sampler that forgets the temperature, or the top-p cut, is caught
    forgets_temperature = Sampler(replace(params, temperature=1.0 if temperature != 1.0 else 0.4), prompt_len=3)
    assert chi_square(forgets_temperature, expected) > bound
    if top_p < 1:
        forgets_top_p = Sampler(replace(params, top_p=1.0), prompt_len=3)
        assert chi_square(forgets_top_p, expected) > bound


def test_pruned_gumbel_max_equals_the_argmax_over_every_survivor():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(49152) * 3).astype(np.float32)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.3, 0, 1.0), (0.8, 40, 1.0), (1.0, 0, 0.9)]:
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
        for seed in range(20):
            sampler = Sampler(replace(params, seed=seed), prompt_len=0)
            z = logits.astype(np.float64) / temperature
            ids = survivors(z, top_k, top_p, 0.0)
            ids = np.arange(len(z)) if ids is None else ids
            naive = int(ids[np.argmax(z[ids] + gumbel(seed, 5, ids))])
            assert sampler.sample(logits, [], 5) == naive


# --- filters and penalties -----------------------------------------------------------------------


def test_filters_keep_what_their_definitions_say():
    z = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05]))
    assert survivors(z, 0, 1.0, 0.0) is None  # no filter: every token
    assert survivors(z, 2, 1.0, 0.0).tolist() == [0, 1]
    assert survivors(z, 0, 0.7, 0.0).tolist() == [0, 1]  # 0.4 + 0.3 reaches 0.7
    assert survivors(z, 0, 0.71, 0.0).tolist() == [0, 1, 2]
    # top-p over what top-k left: the top 2 hold 0.7 / 0.85 = 0.82 of the top 3 (of all: 0.7)
    assert survivors(z, 3, 0.8, 0.0).tolist() == [0, 1]
    assert survivors(z, 0, 0.8, 0.0).tolist() == [0, 1, 2]
    assert survivors(z, 0, 1.0, 0.3).tolist() == [0, 1, 2]  # >= 0.3 * 0.4
    assert survivors(z, 0, 0.01, 0.0).tolist() == [0]  # at least the top token


def test_top_p_over_a_large_vocabulary_equals_a_full_sort():
    rng = np.random.default_rng(1)
    for scale in (0.5, 3.0, 10.0):
        z = rng.standard_normal(49152) * scale
        probs = np.exp(z - z.max())
        order = np.lexsort((np.arange(len(z)), -probs))
        for top_p in (0.5, 0.9, 0.99):
            mass = np.cumsum(probs[order])
            expected = np.sort(order[: int(np.searchsorted(mass, top_p * probs.sum())) + 1])
            assert np.array_equal(survivors(z, 0, top_p, 0.0), expected)


def test_penalties_read_the_prompt_and_output_as_documented():
    logits = np.array([2.0, -1.0, 0.5, 1.0])
    params = SamplingParams(
        temperature=1.0, seed=0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    sampler = Sampler(params, prompt_len=2)
    # prompt [0, 1], output [2, 2]: repetition on 0, 1, 2; frequency and presence on 2 only
    z = sampler.penalised(logits, [0, 1, 2, 2])
    assert z.tolist() == [1.0, -2.0, 0.25 - 2 * 0.5 - 0.25, 1.0]


def test_top_k_one_is_greedy_and_temperature_zero_needs_no_seed():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal(1000).astype(np.float32)
    for seed in range(10):
        assert Sampler(SamplingParams(temperature=1.3, top_k=1, seed=seed), 0).sample(logits, [], 3) == int(
            np.argmax(logits)
        )
    greedy = Sampler(SamplingParams(), 0)
    assert greedy.params.greedy and greedy.params.seed is None


def test_greedy_with_penalties_draws_no_seed():
    """Penalties need the logits on the host (not greedy's in-graph ids), but nothing is drawn: no seed to report."""
    penalised = Sampler(SamplingParams(repetition_penalty=1.2, presence_penalty=0.5), 0)
    assert not penalised.params.greedy and penalised.params.seed is None
    assert penalised.independent() is penalised  # an uncoupled draft: no noise to make its own


def test_logprobs_are_the_models_log_softmax():
    logits = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    record = Sampler(SamplingParams(logprobs=2), 0).logprob(logits, 2)
    logp = logits - np.log(np.exp(logits).sum())
    assert record.token == 2 and record.logprob == pytest.approx(logp[2])
    assert [i for i, _ in record.top] == [1, 2] and record.top[0][1] == pytest.approx(logp[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), "temperature must be 0 \\(greedy\\) or a number >= 1e-05"),
        (dict(temperature=1e-310), "temperature must be 0 \\(greedy\\) or a number >= 1e-05"),  # logits / T: inf
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_p=0.0), r"top_p must be a number in \(0, 1\]"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(top_k=2.5), "top_k"),
        (dict(min_p=1.2), "min_p"),
        (dict(seed=1.5), "seed must be an integer"),
        (dict(seed="7"), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(repetition_penalty=0), "repetition_penalty must be a number from 0.01 to 100"),
        (dict(repetition_penalty=5e-324), "repetition_penalty must be a number from 0.01 to 100"),
        (dict(frequency_penalty=3), "frequency_penalty"),
        (dict(logprobs=21), "logprobs must be an integer from 0 to 20"),
        (dict(logprobs=-1), "logprobs"),
        (dict(coupled_draft="yes"), "coupled_draft"),
    ],
)
def test_bad_parameters_are_clear_errors(kwargs, match):
    with pytest.raises(InputError, match=match):
        SamplingParams(**kwargs)
