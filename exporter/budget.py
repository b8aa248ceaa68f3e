"""What an export costs the machine's disk, decided before any graph is traced.

(The export's check still holds the PyTorch model and an onnxruntime session of the same weights
at once, about twice the weights: a layer-by-layer check for models past that is issue 34's next step.)
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
