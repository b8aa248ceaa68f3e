"""The export's weight step: every graph file of the artifact through the same weight pass.

The quantized graphs are written beside the float ones, in a staging folder, with every weight
in ONE shared file (`.weights/weights.data`: a tensor both graphs read is stored once), checked
against the float graph, and only then moved over the float graphs; the float data files go.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..options import ExportOptions
from .gguf_weights import Candidate, GgufWeights, WeightPlan
from .graph_weights import data_files
from .quantize import Planner, WeightReport, float_planner, quantize_graph_file
from .weight_file import WEIGHTS_FILE, WeightFile

STAGING = ".weights"


def quantize_graphs(
    folder: Path,
    graphs: dict[str, str],
    gguf_path: Path | None,
    options: ExportOptions,
    step,
    max_positions: int | None = None,
) -> WeightReport:
    """Write folder/.weights/<file> for each graph file and their one folder/.weights/weights.data;
    return what was done (the same for each file). max_positions: the model's, for the rotary tables
    (None: rotary stays as traced)."""
    kind = "gguf" if options.weights == "gguf" else options.quantize
    if kind == "gguf":
        step(f"mapping {gguf_path.name}'s quantized blocks onto MatMulNBits (accuracy level {options.accuracy_level})")
        planner = GgufWeights(gguf_path).plan
    else:
        step(f"quantizing weights to {kind} (MatMulNBits, accuracy level {options.accuracy_level})")
        planner = float_planner(kind)
    planner = planned_once(planner)
    staging = folder / STAGING
    staging.mkdir(exist_ok=True)
    report = WeightReport(kind, options.accuracy_level)
    with WeightFile(staging) as weights:
        for name in dict.fromkeys(graphs.values()):
            plan = quantize_graph_file(
                folder / name,
                staging / name,
                planner,
                options.accuracy_level,
                max_positions=max_positions,
                weights=weights,
            )
            report.tensor_types, report.kept_float = plan.tensor_types(), plan.kept_types()
            report.attention_extra_row |= plan.padded_attention > 0
            report.messages = sorted({why for _, why in plan.kept_float.values()})
            report.graph_bytes[name] = (staging / name).stat().st_size
            del plan  # its blocks' makers hold the graph it was made from
        report.graph_bytes[weights.name] = weights.size
    for message in report.messages:
        step(f"  {message}")
    return report


def planned_once(planner: Planner) -> Planner:
    """`planner`, each stored weight planned once across the artifact's graphs: the in-place graph reads
    the portable one's weights (the same file, offsets and layout), so its candidates take their plans.
    A GGUF match reads, hashes and verifies every matrix: at 8B that is minutes a graph."""
    done: dict = {}  # Candidate.stored -> (its Planned or None, its kept_float entry or None)

    def plan(candidates: list[Candidate]) -> WeightPlan:
        fresh = [c for c in candidates if c.stored is None or c.stored not in done]
        out = planner(fresh)
        for c in fresh:
            if c.stored is not None:
                done[c.stored] = (out.matrices.get(c.name), out.kept_float.get(c.name))
        planned = {c.name for c in fresh}
        for c in candidates:
            if c.stored is not None and c.name not in planned:
                matrix, kept = done[c.stored]
                if matrix is not None:
                    out.matrices[c.name] = matrix
                if kept is not None:
                    out.kept_float[c.name] = kept
        return out

    return plan


def staged(folder: Path, name: str) -> Path:
    return folder / STAGING / name


def replace_graphs(folder: Path, graphs: dict[str, str]) -> None:
    """Move the staged graphs and their weights file over the float ones, removing the float graphs'
    external data files (whatever their protos name: `weights.data`, `model.onnx.data`)."""
    staging = folder / STAGING
    names = list(dict.fromkeys(graphs.values()))
    stale = {data for name in names for data in data_files(folder / name)}
    for name in names:
        (staging / name).replace(folder / name)
    for data in stale - {WEIGHTS_FILE}:
        (folder / data).unlink(missing_ok=True)
    (staging / WEIGHTS_FILE).replace(folder / WEIGHTS_FILE)
    shutil.rmtree(staging)
