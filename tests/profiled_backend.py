"""A TensorRT engine's limits without a GPU: a tiny model on onnxruntime CPU served through the
optimization profiles an EngineRecord lists (as `jacobi-rt build` writes them). A pass that no
profile covers is refused, as TrtContext refuses it, so the runtime's respect for an engine's
context, prefill chunk and widest window is tested here."""

from __future__ import annotations

from jacobi_rt.engines.profiles import Limits, derive_profiles
from jacobi_rt.runtime.backends.base import Backend, BackendLimits
from jacobi_rt.runtime.backends.trt_plans import Profile, pick_profile, serving_limits
from jacobi_rt.runtime.errors import BackendError


def engine_profiles(manifest, limits: Limits) -> list[dict]:
    """EngineRecord.profiles of an engine built with these limits."""
    return [p.to_dict() for p in derive_profiles(manifest, limits)]


class ProfiledBackend(Backend):
    def __init__(self, inner: Backend, profiles: list[dict]):
        self.inner, self.manifest = inner, inner.manifest
        self.name = "tensorrt-profiles-on-cpu"
        self.profiles = [Profile.from_dict(p) for p in profiles]
        self.passes: list[tuple[int, int]] = []  # (window, past) of every pass

    @property
    def limits(self) -> BackendLimits:
        return serving_limits(self.profiles, self.manifest.max_context)

    def context(self, capacity: int, batch: int = 1) -> ProfiledContext:
        return ProfiledContext(self.inner.context(capacity, batch), self)


class ProfiledContext:
    def __init__(self, ctx, owner: ProfiledBackend):
        self._ctx, self._owner = ctx, owner

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def forward(self, ids, *args, **kwargs):
        batch, window = ids.shape
        past = self._ctx.length
        if pick_profile(self._owner.profiles, batch, window, past) is None:
            raise BackendError(
                f"no optimization profile of the engine covers batch {batch}, window {window}, past {past}"
            )
        self._owner.passes.append((window, past))
        return self._ctx.forward(ids, *args, **kwargs)

    def close(self) -> None:
        self._ctx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.close()
