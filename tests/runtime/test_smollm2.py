"""The real SmolLM2-135M: Jacobi equals greedy on varied prompts (slow: about a minute on 2 cores)."""

from __future__ import annotations

import pytest

PROMPTS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "List five prime numbers and explain why they are prime."}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    "The history of the Roman Empire began",
    "def fibonacci(n):\n",
]


@pytest.mark.slow
def test_smollm2_jacobi_equals_greedy(generator):
    gen = generator("smollm2-135m")
    for prompt in PROMPTS:
        kwargs = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
        greedy = gen.generate(max_new_tokens=64, strategy="greedy", **kwargs)
        jacobi = gen.generate(max_new_tokens=64, strategy="jacobi", window=8, **kwargs)
        if jacobi.ids != greedy.ids:
            at = next(i for i, (a, b) in enumerate(zip(jacobi.ids, greedy.ids)) if a != b)
            pytest.fail(
                f"{prompt!r}: jacobi and greedy differ first at new token {at} "
                f"({jacobi.ids[at]} vs {greedy.ids[at]}); "
                "if the top-2 logits there are within ~1e-4 it is a numerical near-tie"
            )
        assert len(greedy.ids) == 64 or greedy.stats.finish_reason == "eos"


@pytest.mark.slow
def test_smollm2_inplace_greedy_equals_portable_greedy(artifact):
    from jacobi_rt.runtime import Generator

    folder = artifact("smollm2-135m")
    inplace, portable = (Generator.load(folder, graph=g, verify=False) for g in ("inplace", "portable"))
    assert inplace.backend.graph == "inplace" and portable.backend.graph == "portable"
    for prompt in PROMPTS[:3]:
        kwargs = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
        a = portable.generate(max_new_tokens=64, strategy="greedy", **kwargs).ids
        b = inplace.generate(max_new_tokens=64, strategy="greedy", **kwargs).ids
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            pytest.fail(
                f"{prompt!r}: the graphs' greedy outputs differ first at new token {at}; "
                "`python -m benchmarks.graph_bench` reports the top-2 gap there (a near-tie if tiny)"
            )
