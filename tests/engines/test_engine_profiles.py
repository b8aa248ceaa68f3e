"""Optimization profiles from the manifest and the user's limits (pure: no TensorRT)."""

from __future__ import annotations

import pytest
from manifests import manifest

from jacobi_rt.engines.profiles import Limits, derive_profiles
from jacobi_rt.runtime.backends.trt_plans import Profile, Range, pick_profile
from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.spec import input_names


def test_default_profiles_tune_decode_for_small_windows_and_prefill_for_chunks():
    decode, prefill = derive_profiles(manifest(max_context=8192))
    assert (decode.name, decode.batch, decode.window, decode.past) == (
        "decode",
        Range(1, 1, 1),
        Range(1, 16, 32),
        Range(0, 1024, 8191),
    )
    assert (prefill.name, prefill.window, prefill.past) == ("prefill", Range(1, 256, 256), Range(0, 256, 8191))


def test_every_input_gets_consistent_corners():
    m = manifest(max_context=512, layers=2)
    decode = derive_profiles(m, Limits(max_batch=4))[0]
    shapes = decode.shapes(m.architecture.num_layers, m.architecture.kv_heads, m.architecture.head_dim)
    assert list(shapes) == input_names(2)
    for corner in range(3):  # min, opt, max: total = past + window at each
        batch, window = shapes["input_ids"][corner]
        _, _, past, head_dim = shapes["past_key_values.1.value"][corner]
        assert shapes["attention_mask"][corner] == (batch, past + window)
        assert shapes["window_mask"][corner] == (batch, window, window)
        assert shapes["past_key_values.0.key"][corner] == (batch, 3, past, 64) and head_dim == 64
    assert shapes["input_ids"] == ((1, 1), (1, 16), (4, 32))


def test_small_contexts_shrink_the_profiles():
    (decode, prefill) = derive_profiles(manifest(max_context=256))
    assert decode.window == Range(1, 16, 32) and decode.past == Range(0, 128, 255)
    assert prefill.window == Range(1, 256, 256)
    (only,) = derive_profiles(manifest(max_context=20))
    assert only.window == Range(1, 16, 20) and only.past.max == 19
    (only,) = derive_profiles(manifest(), Limits(decode_window=64, prefill_window=64))
    assert only.name == "decode" and only.window.max == 64


@pytest.mark.parametrize(
    "limits, match",
    [
        (Limits(max_context=9000), "between 2 and the artifact's max_context of 8192"),
        (Limits(max_context=1), "between 2"),
        (Limits(max_batch=0), "--max-batch must be at least 1"),
        (Limits(decode_window=0), "--decode-window must be at least 1"),
        (Limits(prefill_window=-3), "--prefill-window must be at least 1"),
    ],
)
def test_bad_limits_are_clear_errors(limits, match):
    with pytest.raises(InputError, match=match):
        derive_profiles(manifest(), limits)


def test_range_refuses_disorder():
    with pytest.raises(InputError, match="min <= opt <= max"):
        Range(4, 2, 8)


def test_each_pass_picks_the_first_covering_profile():
    profiles = derive_profiles(manifest(max_context=1024))
    assert pick_profile(profiles, 1, 1, 0) == 0
    assert pick_profile(profiles, 1, 32, 990) == 0
    assert pick_profile(profiles, 1, 33, 0) == 1
    assert pick_profile(profiles, 1, 256, 700) == 1
    assert pick_profile(profiles, 1, 257, 0) is None
    assert pick_profile(profiles, 2, 1, 0) is None
    assert pick_profile(profiles, 1, 1, 1024) is None


def test_profiles_round_trip_through_the_manifest_record():
    for profile in derive_profiles(manifest()):
        data = profile.to_dict()
        assert data["window"] == [profile.window.min, profile.window.opt, profile.window.max]
        assert Profile.from_dict(data) == profile
    assert "decode: batch 1..1 (opt 1), window 1..32 (opt 16)" in derive_profiles(manifest())[0].describe()
