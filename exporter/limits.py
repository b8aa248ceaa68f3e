"""What a model's config allows the export: the longest context it serves faithfully, and the rope
types it can trace. One place, read from config.json before loading and from the loaded config after.

The window graph's explicit mask replaces a sliding-window mask, so the context stays inside the
window. `longrope` switches from its short to its long factors once a pass reaches
`original_max_position_embeddings`, which would leave a cache rotated with both: the context stays
below it and the short factors are traced. `dynamic` only rescales past `max_position_embeddings`,
so inside the model's positions its static frequencies are exact.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from jacobi_rt.runtime.errors import ModelSourceError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass
class ContextLimit:
    positions: int
    why: str  # what sets it, for messages (plain words: the CLI prints them as they are): "the model's 256 positions"


def context_limit(config: dict) -> ContextLimit | None:
    """The longest context `config` (config.json's fields, or a loaded config's to_dict()) exports
    faithfully; None when the config names no positions."""
    positions = _positive(config.get("max_position_embeddings")) or _positive(config.get("n_positions"))
    limits = [ContextLimit(positions, f"the model's {positions} positions")] if positions else []
    window = _sliding_window(config)
    if window:
        limits.append(
            ContextLimit(window, f"the model's sliding window of {window} positions, config.json's sliding_window")
        )
    for rope in rope_settings(config):
        original = _positive(rope.get("original_max_position_embeddings")) or _positive(
            config.get("original_max_position_embeddings")
        )
        if _rope_type(rope) == "longrope" and original:
            limits.append(
                ContextLimit(
                    original,
                    f"longrope's original_max_position_embeddings, {original}: past it the model "
                    "switches to its long factors mid-sequence",
                )
            )
    return min(limits, key=lambda limit: limit.positions, default=None)


def check_config(config: dict, where: str) -> None:
    """Refuse a config the export cannot follow faithfully, naming the field and its value: an
    unknown rope type, or ALiBi (Falcon-RW: positions as an attention bias, which the graphs lack)."""
    if config.get("alibi") is True:
        raise ModelSourceError(
            f"{where}: alibi true (ALiBi position biases) is not supported; only rotary Falcon models export"
        )
    for rope in rope_settings(config):
        kind = _rope_type(rope)
        if kind not in ROPE_TYPES:
            raise ModelSourceError(
                f"{where}: rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
            )


def rope_settings(config: dict) -> list[dict]:
    """Every rope parameter set of the config: one, or one per layer type (Gemma 3's local and global)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        return []
    nested = [v for v in rope.values() if isinstance(v, dict)]
    return nested or [rope]


def _rope_type(rope: dict) -> str:
    return str(rope.get("rope_type") or rope.get("type") or "default")


def _sliding_window(config: dict) -> int | None:
    if config.get("use_sliding_window") is False:
        return None
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and "sliding_attention" not in layer_types:
        return None
    return _positive(config.get("sliding_window"))


def _positive(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@contextlib.contextmanager
def static_rope(model):
    """Trace the rotary embeddings' static branch: `dynamic` and `longrope` pick their frequencies
    with a data-dependent branch on the largest position, which torch.export cannot trace (dynamic)
    or which a rotary table built over every position would take the wrong way (longrope). Inside
    the context limit above, the static frequencies are the ones the model uses."""
    saved = []
    for module in model.modules():
        kinds = getattr(module, "rope_type", None)
        rotary = any(name.endswith("inv_freq") for name, _ in module.named_buffers(recurse=False))
        if not rotary or not isinstance(kinds, (str, dict)):
            continue
        per_prefix = {"": kinds} if isinstance(kinds, str) else {f"{layer}_": kind for layer, kind in kinds.items()}
        for prefix, kind in per_prefix.items():
            if kind in ("dynamic", "longrope"):
                getattr(module, f"{prefix}inv_freq").copy_(getattr(module, f"{prefix}original_inv_freq"))
        saved.append((module, kinds))
        module.rope_type = "default" if isinstance(kinds, str) else dict.fromkeys(kinds, "default")
    try:
        yield model
    finally:
        for module, kinds in saved:
            module.rope_type = kinds
