"""onnxruntime on the CUDA execution provider: KV resident on the device, every strategy equals greedy."""

from __future__ import annotations

import pytest
from exactness import assert_cache_round_trip, assert_side_branches_stay_greedy, assert_strategies_equal_greedy

from jacobi_rt.runtime.backends.onnxrt import OrtBackend, OrtDeviceContext
from jacobi_rt.runtime.manifest import load_manifest

pytestmark = pytest.mark.gpu
SMOL_PROMPTS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain what a hash table is and when to use one."}],
]


@pytest.fixture(scope="module")
def llama(artifact, ort_cuda):
    folder = artifact("llama")
    manifest = load_manifest(folder)
    return OrtBackend(folder, manifest, device="cuda"), OrtBackend(folder, manifest, device="cpu")


def test_contexts_live_on_the_device(llama):
    cuda, _ = llama
    assert cuda.device == "cuda" and "CUDAExecutionProvider" in cuda.session.get_providers()
    with cuda.context(16) as ctx:
        assert isinstance(ctx, OrtDeviceContext)


def test_cache_round_trip_on_the_device(llama):
    cuda, cpu = llama
    assert_cache_round_trip(cuda, cpu, atol=1e-4, logit_atol=1e-3)


def test_side_branches_gather_on_the_device(llama):
    assert_side_branches_stay_greedy(llama[0])


def test_every_strategy_equals_greedy(artifact, ort_cuda):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("llama"), draft=artifact("llama-draft1"), backend="cuda")
    assert gen.backend.device == "cuda"
    assert_strategies_equal_greedy(gen, draft=True)


def test_smollm2_every_strategy_equals_greedy(artifact, ort_cuda):
    from jacobi_rt.runtime import Generator

    gen = Generator.load(artifact("smollm2-135m"), draft=artifact("smollm2-135m-draft6"), backend="cuda")
    assert_strategies_equal_greedy(gen, prompts=SMOL_PROMPTS, new=64, draft=True)
