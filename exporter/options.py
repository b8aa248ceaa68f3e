"""`ExportOptions`: what `export()` makes of a model, as one typed record.

Errors name the parameters (`max_context`), never a command's flags: the CLI translates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from jacobi_rt.runtime.errors import OptionError

DTYPES = {"fp32": "float32", "fp16": "float16"}
QUANTIZE = ("int8", "int4")
WEIGHTS = ("float", "gguf")
ACCURACY_LEVELS = (0, 4)  # MatMulNBits: 0 = float activations, 4 = int8 activations (the fast CPU path)
ROLES = ("target", "draft")
CHECKS = ("auto", "full", "layers")  # budget.check_method decides auto


@dataclass
class ExportOptions:
    dtype: str = "fp32"  # weights and KV cache; fp16 is for GPUs
    quantize: str | None = None  # int8 | int4: re-quantize the MatMul weights (MatMulNBits)
    weights: str = "float"  # gguf: keep a GGUF source's own quantized blocks (MatMulNBits), no re-rounding
    accuracy_level: int = 4  # of the MatMulNBits nodes (quantize or gguf weights)
    max_context: int | None = None  # longest prompt + output served; None: the model's maximum
    opset: int = 18
    role: str = "target"  # target | draft
    keep_layers: int | None = None  # export only the first N decoder layers: a draft cut from the target
    inplace: bool = True  # also the in-place graph (onnxruntime's GroupQueryAttention, CPU) when the family maps
    graphs_from: str | None = (
        None  # a float-weights artifact of the same model: reuse its checked graphs, run only the weight pass
    )
    stream: bool = (
        True  # read the weights one tensor at a time from the source's files; False: load the whole model first
    )
    check: str = (
        "auto"  # full: the whole graph against the whole model; layers: layer by layer; auto: full when it fits
    )
    check_memory: int | None = None  # bytes of memory auto counts on; None: what the kernel says is available

    def validate(self) -> None:
        """Refuse values no model accepts (limits that depend on the model are checked later)."""
        _one_of("dtype", self.dtype, DTYPES)
        if self.quantize is not None:
            _one_of("quantize", self.quantize, QUANTIZE)
        _one_of("weights", self.weights, WEIGHTS)
        _one_of("accuracy_level", self.accuracy_level, ACCURACY_LEVELS)
        _one_of("role", self.role, ROLES)
        _one_of("check", self.check, CHECKS)
        if not 17 <= self.opset <= 23:
            raise OptionError(f"`opset` must be between 17 and 23, not {self.opset}", "opset")
        if self.quantize and self.weights == "gguf":
            raise OptionError(
                "`quantize` re-rounds the weights and `weights` gguf keeps the GGUF's own: choose one",
                "quantize",
                "weights",
            )
        if self.graphs_from is not None and not self.quantized:
            raise OptionError(
                "`graphs_from` reuses an artifact's graphs for a weight pass: add `quantize` or `weights` gguf "
                "(without one, the export would be a copy of that artifact)",
                "graphs_from",
                "quantize",
                "weights",
            )
        if self.dtype != "fp32" and self.quantized:
            raise OptionError(
                "quantized weights (`quantize`, `weights` gguf) need `dtype` fp32", "quantize", "weights", "dtype"
            )

    @property
    def torch_dtype(self) -> str:
        return DTYPES[self.dtype]

    @property
    def quantized(self) -> bool:
        """The MatMul weights become MatMulNBits blocks (`quantize`, or `weights` gguf)."""
        return bool(self.quantize) or self.weights == "gguf"

    @property
    def matmul_level(self) -> int | None:
        """The MatMulNBits accuracy level of the exported weights; None when they stay float MatMuls."""
        return self.accuracy_level if self.quantized else None


def _one_of(parameter: str, value, allowed) -> None:
    if value not in allowed:
        names = ", ".join(str(a) for a in allowed)
        raise OptionError(f"`{parameter}` must be one of {names}, not {value!r}", parameter)


def check_max_context(max_context: int, limit) -> None:
    """limit: a limits.ContextLimit (its positions and what sets them)."""
    if not 1 <= max_context <= limit.positions:
        raise OptionError(
            f"`max_context` must be between 1 and {limit.positions} ({limit.why}), not {max_context}", "max_context"
        )


def check_keep_layers(keep_layers: int, layers: int) -> None:
    if not 1 <= keep_layers <= layers:
        raise OptionError(
            f"`keep_layers` must be between 1 and the model's {layers} layers, not {keep_layers}", "keep_layers"
        )
