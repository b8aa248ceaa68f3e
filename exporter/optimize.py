"""An onnxruntime-specific copy of the window graph, optimized offline."""

from __future__ import annotations

from pathlib import Path


def optimize_for_onnxruntime(source: Path, target: Path) -> Path | None:
    return None
