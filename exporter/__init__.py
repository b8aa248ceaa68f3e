"""The exporter: a causal LM -> the ONNX window graph -> an artifact folder. Needs torch."""

from .export import export

__all__ = ["export"]
