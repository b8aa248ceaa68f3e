"""The exporter: a causal LM -> the ONNX window graph -> an artifact folder. Needs torch."""

from .export import export
from .options import ExportOptions

__all__ = ["ExportOptions", "export"]
