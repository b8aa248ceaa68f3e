"""Where an export's time goes: wall and CPU seconds per stage of one `jacobi-rt export`.

    python -m benchmarks.export_profile smollm2-135m --out build/profile/smollm2 [--json build/profile.json]

Runs the ordinary `export()` with timers wrapped around its stages (loading, each graph's
torch.export capture, decomposition, ONNX translation, onnxscript's optimizer, saving, the
contract's axis names and rewrites, each check, the weight pass). CPU seconds are the process's
(every thread), so a shared machine's load shows as wall > CPU. Stages nest (the trace
contains its capture); each row is one call, in the order they ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path


class Timers:
    def __init__(self):
        self.rows: list[dict] = []
        self.depth = 0

    @contextlib.contextmanager
    def stage(self, name: str):
        row = {"stage": name, "depth": self.depth}
        self.rows.append(row)
        self.depth += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.depth -= 1
            row["wall_s"] = round(time.perf_counter() - wall, 2)
            row["cpu_s"] = round(time.process_time() - cpu, 2)

    def wrap(self, owner, attr: str, name: str | None = None) -> None:
        """Time every call of owner.attr under `name` (a module function or a class's method)."""
        original = getattr(owner, attr)
        label = name or attr

        def timed(*args, **kwargs):
            with self.stage(label):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)


def instrument(timers: Timers) -> None:
    """Wrap the stages of the exporter and of torch.onnx's dynamo exporter that take the time."""
    import torch
    from torch.onnx._internal.exporter import _core, _onnx_program

    from jacobi_rt.exporter import sources
    from jacobi_rt.exporter.checks import check, inplace_check, layer_check
    from jacobi_rt.exporter.graph import trace
    from jacobi_rt.exporter.weights import weight_step

    timers.wrap(sources, "load", "load the model")
    timers.wrap(trace, "trace_window_graph", "trace a window graph")
    timers.wrap(torch.export, "export", "torch.export (capture)")
    timers.wrap(_core, "_prepare_exported_program_for_export", "decompositions")
    timers.wrap(_core, "_exported_program_to_onnx_program", "translate to ONNX")
    timers.wrap(_core.onnxscript_apis, "convert_version", "onnxscript version converter")
    timers.wrap(_core.onnxscript_apis, "optimize", "onnxscript optimizer")
    timers.wrap(_onnx_program.ONNXProgram, "save", "save the ONNX file")
    timers.wrap(trace, "name_axes", "axis names and rewrites (load, edit, save)")
    timers.wrap(check, "check_against_torch", "check portable vs PyTorch")
    timers.wrap(layer_check, "check_layers", "check portable vs PyTorch, layer by layer")
    timers.wrap(inplace_check, "check_inplace_against_torch", "check in-place vs PyTorch")
    timers.wrap(weight_step, "quantize_graphs", "weight pass")
    timers.wrap(check, "check_against_onnx", "check quantized vs float")
    from jacobi_rt.exporter.graph import graph_optimizer

    timers.wrap(graph_optimizer, "rules_that_fire", "rewrite rules that fire (3 layers)")
    timers.wrap(graph_optimizer, "optimize", "onnxscript optimizer, those rules")
    timers.wrap(trace, "extend_layers", "write the other layers")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="HF folder, .gguf, or built-in name (smollm2-135m)")
    parser.add_argument("--out", required=True, type=Path, help="the artifact folder (overwritten)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--quantize", choices=["int8", "int4"], help="as `jacobi-rt export --quantize`")
    parser.add_argument(
        "--trace-all",
        action="store_true",
        help="trace every layer and run onnxscript's full optimizer, as exports did before stitch.py (the A of an A/B)",
    )
    args = parser.parse_args(argv)

    timers = Timers()
    instrument(timers)
    if args.trace_all:
        from jacobi_rt.exporter.graph import trace

        trace.layers_to_trace = lambda model, num_layers: (num_layers, "--trace-all")
    from jacobi_rt.exporter import ExportOptions, export

    with timers.stage("export (total)"):
        export(
            args.model,
            args.out,
            ExportOptions(quantize=args.quantize),
            overwrite=True,
            step=lambda m: print(f"  {m}", flush=True),
        )
    print(f"{'stage':<52} {'wall s':>8} {'cpu s':>8}")
    for row in timers.rows:
        print(f"{'  ' * row['depth'] + row['stage']:<52} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f}")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"argv": sys.argv, "rows": timers.rows, "loadavg": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
