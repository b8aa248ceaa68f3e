"""Time one window pass of an artifact's graph variant(s) at several window and past lengths.

    python -m jacobi_rt.tools.pass_bench build/smollm2-135m --windows 1,4,8,16 --pasts 0,256,1024

Each pass goes through the runtime's own backend context (OrtBackend with IO binding, the KV
cache resident), so the figure is what decoding pays per pass on this machine: the graph
(for the portable variant including its in-graph past->present copy) plus binding. The cache is
filled to `past` by real prefill passes, and each timed window is dropped again (commit(0),
outside the timer). A tool, not a test.
"""

from __future__ import annotations

import statistics
import time

import click
import numpy as np


def time_pass(ctx, window: int, repeats: int) -> float:
    """Median milliseconds of ctx.forward over a window of `window` tokens (greedy ids only)."""
    ids = np.full((1, window), 7, dtype=np.int64)
    ctx.forward(ids)  # warm-up
    ctx.commit(0)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        ctx.forward(ids)
        samples.append(time.perf_counter() - start)
        ctx.commit(0)
    return statistics.median(samples) * 1000


def fill(ctx, past: int, chunk: int = 256) -> None:
    tokens = np.random.default_rng(0).integers(3, min(1000, ctx.backend.manifest.architecture.vocab_size), past)
    for start in range(0, past, chunk):
        piece = tokens[start : start + chunk][None]
        ctx.forward(piece)
        ctx.commit(piece.shape[1])


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--windows", default="1,4,8,16", show_default=True)
@click.option("--pasts", default="0,256,1024", show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=10, show_default=True)
@click.option("--graph", "graphs", multiple=True, type=click.Choice(["portable", "inplace"]),
              help="Graph variant(s) to time (repeatable); default: every variant in the manifest.")
def main(artifact, windows, pasts, threads, repeats, graphs):
    """Median milliseconds per window pass, per graph variant, window and past length."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest

    manifest = load_manifest(artifact, verify=False)
    variants = graphs or sorted(manifest.graphs)
    ws = [int(w) for w in windows.split(",")]
    ps = [int(p) for p in pasts.split(",")]
    print(f"{artifact}: {manifest.architecture.family}, {manifest.dtype}, quantization {manifest.quantization}, {threads} threads")
    print("| graph | past | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|---|" + "---|" * len(ws))
    for variant in variants:
        backend = OrtBackend(artifact, manifest, device="cpu", threads=threads, graph=variant)
        for past in ps:
            with backend.context(past + max(ws) + 1) as ctx:
                fill(ctx, past)
                cells = [time_pass(ctx, w, repeats) for w in ws]
            print(f"| {variant} | {past} | " + " | ".join(f"{c:.1f} ms" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
