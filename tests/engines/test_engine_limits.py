"""An engine's limits (its optimization profiles) reach the runtime: the context, the prefill chunk
and the widest pass come from the profiles, and the Generator keeps every pass inside them."""

from __future__ import annotations

import pytest
from manifests import manifest, record
from profiled_backend import ProfiledBackend, engine_profiles

from jacobi_rt.engines.profiles import Limits, derive_profiles
from jacobi_rt.runtime.backends.base import BackendLimits
from jacobi_rt.runtime.backends.onnxrt import OrtBackend
from jacobi_rt.runtime.backends.trt_plans import Profile, serving_limits
from jacobi_rt.runtime.errors import BackendError, ContextLimitError, InputError
from jacobi_rt.runtime.manifest import load_manifest


def limits_of(engine_record, max_context: int = 8192) -> BackendLimits:
    return serving_limits([Profile.from_dict(p) for p in engine_record.profiles], max_context)


def test_a_recorded_decode_profile_bounds_the_window_and_the_prefill_chunk():
    assert limits_of(record()) == BackendLimits(max_context=8192, prefill_chunk=32, max_window=32)


def test_the_default_build_serves_the_manifest_context_with_256_token_chunks():
    profiles = derive_profiles(manifest(max_context=8192))
    assert serving_limits(profiles, 8192) == BackendLimits(8192, 256, 256)


def test_a_smaller_built_context_wins_over_the_manifest():
    profiles = derive_profiles(manifest(max_context=8192), Limits(max_context=1000, decode_window=4, prefill_window=64))
    assert serving_limits(profiles, 8192) == BackendLimits(1000, 64, 64)
    assert serving_limits(profiles, 512) == BackendLimits(512, 64, 64)  # and the manifest over a larger engine


def test_profiles_that_cannot_start_a_sequence_are_refused():
    late = Profile.from_dict({"name": "decode", "batch": [1, 1, 1], "window": [1, 8, 16], "past": [64, 128, 1023]})
    with pytest.raises(BackendError, match="no optimization profile of the engine serves batch 1"):
        serving_limits([late], 8192)


@pytest.fixture(scope="module")
def tiny(artifact):
    folder = artifact("llama")
    return folder, OrtBackend(folder, load_manifest(folder), device="cpu", threads=1)


@pytest.fixture
def small_engine(tiny):
    """The tiny llama as an engine built with --max-context 48 --decode-window 4 --prefill-window 8."""
    folder, cpu = tiny
    from jacobi_rt.runtime import Generator
    from jacobi_rt.runtime.tokenizer import Tokenizer

    backend = ProfiledBackend(
        cpu, engine_profiles(cpu.manifest, Limits(max_context=48, decode_window=4, prefill_window=8))
    )
    return Generator(backend, Tokenizer(folder, cpu.manifest)), Generator(cpu, Tokenizer(folder, cpu.manifest))


@pytest.mark.parametrize("strategy", ["greedy", "jacobi", "lookahead", "auto"])
def test_every_pass_stays_inside_the_engine_profiles(small_engine, strategy):
    engine, plain = small_engine
    prompt = list(range(3, 23))  # 20 tokens: more than one 8-token prefill chunk
    result = engine.generate(prompt, max_new_tokens=60, strategy=strategy)
    assert result.ids == plain.generate(prompt, max_new_tokens=60, strategy="greedy").ids[: len(result.ids)]
    assert result.stats.finish_reason == "context" and len(prompt) + len(result.ids) <= 48
    assert result.stats.prefill_passes == 3
    assert max(window for window, _ in engine.backend.passes) <= 8


def test_the_engine_context_is_checked_before_generating(small_engine):
    engine, _ = small_engine
    assert engine.limits == BackendLimits(48, 8, 8)
    with pytest.raises(ContextLimitError, match="engine's context holds 48"):
        engine.generate(list(range(3, 53)), max_new_tokens=4)
    with pytest.raises(InputError, match="window must be between 1 and 8 tokens"):
        engine.generate([5, 6, 7], max_new_tokens=4, strategy="jacobi", window=16)


def test_a_speculative_draft_on_an_engine_prefills_in_its_chunks(small_engine, tiny):
    engine, plain = small_engine
    engine.draft = ProfiledBackend(
        tiny[1], engine_profiles(tiny[1].manifest, Limits(max_context=48, decode_window=16, prefill_window=8))
    )
    prompt = list(range(3, 33))
    result = engine.generate(prompt, max_new_tokens=10, strategy="speculative")
    assert result.ids == plain.generate(prompt, max_new_tokens=10, strategy="greedy").ids
    assert engine.draft.passes and max(window for window, _ in engine.draft.passes) <= 16


@pytest.mark.parametrize("jacobi_tail", [False, True])
def test_a_draft_engine_with_narrow_profiles_gets_passes_it_covers(small_engine, artifact, jacobi_tail):
    """An unrelated draft (almost every guess wrong) sits out and catches up: its pending tokens, and
    the Jacobi tail's guesses, must still fit the draft engine's 4-token passes."""
    engine, plain = small_engine
    folder = artifact("qwen2")
    other = OrtBackend(folder, load_manifest(folder), device="cpu", threads=1)
    engine.draft = ProfiledBackend(
        other, engine_profiles(other.manifest, Limits(max_context=48, decode_window=2, prefill_window=4))
    )
    for prompt in (list(range(3, 23)), [5, 17, 33]):
        result = engine.generate(prompt, max_new_tokens=24, strategy="speculative", jacobi_tail=jacobi_tail)
        assert result.ids == plain.generate(prompt, max_new_tokens=24, strategy="greedy").ids
    assert max(window for window, _ in engine.draft.passes) <= 4
