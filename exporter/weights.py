"""The export's weight step: every graph file of the artifact through the same weight pass.

The quantized files are written beside the float ones (in a staging folder, under their final
names, since an external-data file's name is stored inside its graph), checked against the float
graph, and only then moved over them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .gguf_weights import GgufWeights
from .options import ExportOptions
from .quantize import WeightReport, float_planner, quantize_graph_file

STAGING = ".weights"


def quantize_graphs(folder: Path, graphs: dict[str, str], gguf_path: Path | None, options: ExportOptions, step,
                    max_positions: int | None = None) -> WeightReport:
    """Write folder/.weights/<file> for each graph file; return what was done (the same for each file).
    max_positions: the model's, for the rotary tables (None: rotary stays as traced)."""
    kind = "gguf" if options.weights == "gguf" else options.quantize
    if kind == "gguf":
        step(f"mapping {gguf_path.name}'s quantized blocks onto MatMulNBits (accuracy level {options.accuracy_level})")
        planner = GgufWeights(gguf_path).plan
    else:
        step(f"quantizing weights to {kind} (MatMulNBits, accuracy level {options.accuracy_level})")
        planner = float_planner(kind)
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    report = WeightReport(kind, options.accuracy_level)
    for name in dict.fromkeys(graphs.values()):
        plan = quantize_graph_file(folder / name, staging / name, planner, options.accuracy_level, max_positions=max_positions)
        report.tensor_types, report.kept_float = plan.tensor_types(), plan.kept_types()
        report.attention_extra_row |= plan.padded_attention > 0
        report.messages = sorted({why for _, why in plan.kept_float.values()})
        report.graph_bytes[name] = sum(p.stat().st_size for p in (staging / name, staging / (name + ".data")) if p.is_file())
    for message in report.messages:
        step(f"  {message}")
    return report


def staged(folder: Path, name: str) -> Path:
    return folder / STAGING / name


def replace_graphs(folder: Path, graphs: dict[str, str]) -> None:
    """Move the staged quantized files over the float ones (graph and data file together)."""
    staging = folder / STAGING
    for name in dict.fromkeys(graphs.values()):
        for file in (name, name + ".data"):
            (folder / file).unlink(missing_ok=True)
            if (staging / file).is_file():
                (staging / file).rename(folder / file)
    shutil.rmtree(staging)
