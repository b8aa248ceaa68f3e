"""What an export costs the machine, decided before any graph is traced: its disk, and which check
its memory allows.

The full check holds the whole PyTorch model and the graph in onnxruntime. With a whole session
that is twice the weights, and onnxruntime's session start holds its prepacked copies of the MatMul
weights beside the initializers for a while: about three times the weights at the peak, so it runs
when four times the weights fit in the memory available (a margin for the rest of the machine).
Past STAGED_ABOVE of weights every ONNX side of a check runs stage by stage (staged_run.py), one
layer's weights resident: the full check then needs the PyTorch model and a margin, 1.5 times the
weights. Past that the check runs layer by layer (layer_check.py), one layer on each side.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from jacobi_rt.runtime.errors import OptionError
from jacobi_rt.runtime.slots import available_memory

GB = 1e9
STAGED_ABOVE = 1 * GB  # float weights past which the checks run their ONNX graphs stage by stage
FULL_CHECK_SHARE = (
    4  # the full check with whole sessions runs when this many times the weights fit in the available memory
)
STAGED_FULL_CHECK_SHARE = 1.5  # ... and with staged ones (past STAGED_ABOVE)
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
        raise OptionError(
            f"the export needs about {needed / GB:.1f} GB on the disk of {folder} (the weights as written, "
            f"and their quantized copy when quantized), but {free / GB:.1f} GB are free; "
            "free some space or choose an `out` on another disk",
            "out",
        )


def staged(weights: int) -> bool:
    """Whether the checks run their ONNX graphs stage by stage (staged_run.py) for `weights` bytes of
    float weights. The figures are the same either way; staged costs SmolLM2-135M (0.54 GB) a few
    seconds more, which is why small models run whole."""
    return weights > STAGED_ABOVE


def full_check_share(weights: int) -> float:
    """How many times the weights the full check needs in memory."""
    return STAGED_FULL_CHECK_SHARE if staged(weights) else FULL_CHECK_SHARE


def check_method(requested: str, weights: int, available: int | None = None) -> str:
    """The export check to run, "full" or "layers", for `weights` bytes of float weights; `requested`
    is one of options.CHECKS; available: bytes of memory to count on (None: available_memory()).
    Refuses "full" before any work when it would not fit."""
    available = available_memory() if available is None else available
    share = full_check_share(weights)
    fits = share * weights <= available
    if requested == "full" and not fits:
        raise OptionError(
            f"the full check holds the model in PyTorch beside the graph in onnxruntime, about {share:g} x "
            f"{weights / GB:.1f} GB with its margin, but {available / GB:.1f} GB of memory are available; "
            "use `check` layers (or auto) to check the graph one layer at a time",
            "check",
        )
    if requested == "auto":
        return "full" if fits else "layers"
    return requested


def staged_agreement(method: str, weights: int) -> bool:
    """Whether a quantized export compares its graph with the float one stage by stage: when the check
    ran layer by layer, and past STAGED_ABOVE, where the two whole sessions (the float graph's
    prepacked copies beside its mapped file, and the quantized graph's) would hold about three times
    the float weights."""
    return method == "layers" or staged(weights)
