"""What an export costs the machine: whether its check fits in memory end to end, and whether the
destination's disk holds the artifact. Both are decided before any graph is traced.

The end-to-end check holds the PyTorch model and an onnxruntime session of the same weights at
once (about twice the weights); it runs when that takes at most a quarter of this machine's
memory, else each layer is checked on its own (layer_check.py), one layer's weights resident.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from jacobi_rt.runtime.errors import OptionError

GB = 1e9
QUANTIZED_SHARE = {"int4": 0.16, "int8": 0.28, "gguf": 0.30}  # of the float32 bytes, blocks and scales, rounded up


def weight_bytes(model) -> int:
    """Bytes of the model's distinct parameters in the export dtype."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_bytes() -> int:
    """This machine's memory (or the cgroup's limit, when lower)."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            value = limit.read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


def check_method(weights: int, chosen: str) -> str:
    """"full" (end to end) or "layers" for a model of `weights` bytes: `chosen` unless "auto", which
    takes full when it fits (see above)."""
    if chosen != "auto":
        return chosen
    return "full" if 2 * weights <= memory_bytes() / 4 else "layers"


def needed_disk(weights: int, kind: str | None) -> int:
    """The most the staging folder holds at once: the float weights once, plus their quantized copy."""
    return int(weights * (1 + QUANTIZED_SHARE[kind])) if kind else weights


def check_disk(folder: Path, needed: int) -> None:
    """Refuse before any work when `folder`'s disk cannot hold `needed` bytes, saying how much it needs."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise OptionError(f"the export needs about {needed / GB:.1f} GB on the disk of {folder} (the weights as written, "
                          f"and their quantized copy when quantized), but {free / GB:.1f} GB are free; "
                          "free some space or choose an `out` on another disk", "out")
