"""Optimization profiles for a TensorRT engine, derived from the manifest and the user's limits.

TensorRT tunes its kernels at each profile's `opt` shape, so one profile cannot serve both a
256-token prompt chunk and a 1-token decoding pass well. Two profiles:

    decode   window 1..32 (opt 16), past 0..max_context-1 (opt min(1024, half))
    prefill  window 1..256 (opt 256), past 0..max_context-1 (opt one chunk)

The runtime (runtime/backends/trt_plans.py: `Profile`, `pick_profile`) picks, per pass, the first
profile (in this order) that covers the pass's batch, window and past. Every input's range comes
from runtime/spec.py's axes, with total = past + window at the min, opt and max corners, so each
corner is a shape the graph can really take.
"""

from __future__ import annotations

from dataclasses import dataclass

from jacobi_rt.runtime.backends.base import PREFILL_CHUNK
from jacobi_rt.runtime.backends.trt_plans import Profile, Range
from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.manifest import Manifest

DECODE_WINDOW = 32  # decode kernels are tuned for windows up to this
PREFILL_WINDOW = PREFILL_CHUNK  # the runtime's prefill chunk


@dataclass(frozen=True)
class Limits:
    """What the engine must serve. max_context None = the manifest's."""

    max_batch: int = 1
    max_context: int | None = None
    decode_window: int = DECODE_WINDOW
    prefill_window: int = PREFILL_WINDOW


def derive_profiles(manifest: Manifest, limits: Limits = Limits()) -> list[Profile]:
    """The decode profile, then the prefill profile (omitted when it would add nothing)."""
    context = _check_limits(manifest, limits)
    past = Range(0, min(1024, context // 2), context - 1)
    batch = Range(1, 1, limits.max_batch)
    decode_max = min(limits.decode_window, context)
    profiles = [Profile("decode", batch, Range(1, min(16, decode_max), decode_max), past)]
    prefill_max = min(limits.prefill_window, context)
    if prefill_max > decode_max:
        prefill_past = Range(0, min(prefill_max, past.max), past.max)
        profiles.append(Profile("prefill", batch, Range(1, prefill_max, prefill_max), prefill_past))
    return profiles


def _check_limits(manifest: Manifest, limits: Limits) -> int:
    context = manifest.max_context if limits.max_context is None else limits.max_context
    if not 2 <= context <= manifest.max_context:
        raise InputError(
            f"--max-context must be between 2 and the artifact's max_context of {manifest.max_context}, not {context}; "
            "re-export with a larger --max-context to go further"
        )
    for name, value in (
        ("--max-batch", limits.max_batch),
        ("--decode-window", limits.decode_window),
        ("--prefill-window", limits.prefill_window),
    ):
        if value < 1:
            raise InputError(f"{name} must be at least 1, not {value}")
    return context
