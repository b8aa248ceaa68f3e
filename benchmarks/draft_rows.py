"""One pass of R rows x W tokens on one in-place context of R rows, against R one-row passes: what a
batched draft (or target) pass costs per row.

For each past, a context of each row count is filled with random tokens to that past; then the
shapes take turns, `--repeats` times, each pass left uncommitted (commit(0)) so the past stays put.
Median milliseconds per shape, and its cost as a fraction of R one-row W=1 passes.

    python -m benchmarks.draft_rows build/smollm2-135m-int8 --shapes 1x1,2x1,4x1,8x1 --pasts 100,300,500
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click
import numpy as np


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--shapes", default="1x1,2x1,4x1,8x1", show_default=True, help="ROWSxWIDTH, comma-separated; 1x1 first")
@click.option("--pasts", default="100,300,500", show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=20, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
def main(artifact, shapes, pasts, repeats, threads):
    """Median time of one pass per (rows, width) shape, on the artifact's in-place graph."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest

    backend = OrtBackend(Path(artifact), load_manifest(artifact, verify=False), "cpu", threads, "inplace")
    vocab = backend.manifest.architecture.vocab_size
    rng = np.random.default_rng(0)
    wanted = [tuple(int(n) for n in s.split("x")) for s in shapes.split(",")]
    for past in (int(p) for p in pasts.split(",")):
        contexts = {}
        for rows in sorted({r for r, _ in wanted}):
            ctx = contexts[rows] = backend.context(past + 64, batch=rows)
            ids = rng.integers(0, vocab, size=(rows, past))
            for at in range(0, past, 128):
                ctx.forward(ids[:, at : at + 128])
                ctx.commit(min(128, past - at))
        times: dict[tuple[int, int], list[float]] = {shape: [] for shape in wanted}
        for _ in range(repeats):
            for rows, width in wanted:
                ids = rng.integers(0, vocab, size=(rows, width))
                started = time.perf_counter()
                contexts[rows].forward(ids)
                times[(rows, width)].append(time.perf_counter() - started)
                contexts[rows].commit(0)
        ms = {shape: statistics.median(t) * 1e3 for shape, t in times.items()}
        one = ms[wanted[0]]
        click.echo(
            f"past {past}: "
            + ", ".join(f"{r}x{w} {ms[(r, w)]:.2f} ms ({ms[(r, w)] / (r * one):.2f} of {r} one-row)" for r, w in wanted)
        )
        for ctx in contexts.values():
            ctx.close()


if __name__ == "__main__":
    main()
