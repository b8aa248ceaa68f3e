"""Time one window pass of an artifact's graph variant(s) at several window and past lengths.

    python -m benchmarks.pass_bench build/smollm2-135m --windows 1,4,8,16 --pasts 0,256,1024
    python -m benchmarks.pass_bench build/smollm2-135m --graph inplace --batches 1,4,16 --windows 1,2,4,8 --pasts 128
    python -m benchmarks.pass_bench build/before build/after --graph portable --windows 1,8 --pasts 0,256

Each pass goes through the runtime's own backend context (OrtBackend with IO binding, the KV
cache resident), so the figure is what decoding pays per pass on this machine: the graph
(for the portable variant including its in-graph past->present copy) plus binding. The cache is
filled to `past` by real prefill passes, and each timed window is dropped again (commit(0),
outside the timer). Every artifact (e.g. before and after a graph change), variant and past length
takes its turn pass by pass in one process, so a ratio between pasts or artifacts is measured under
the same load (this machine's speed drifts by 20% between minutes). A tool, not a test.

`--floor` adds the memory floor of each cell: the bytes a pass must read (the graph's weights, and
the KV cache it attends over; the portable graph also writes its whole present) over the read
bandwidth this machine reaches with the same threads. A pass near its floor can only get faster by
reading fewer bytes; a pass far above it leaves time to kernels and per-node overhead.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import numpy as np


def time_passes(contexts: dict, window: int, repeats: int, clock=time.perf_counter) -> dict:
    """Seconds of ctx.forward over a window of `window` tokens (greedy ids only), per variant; the
    variants take turns pass by pass, so load from other processes hits them alike."""
    samples: dict = {name: [] for name in contexts}
    for turn in range(repeats + 1):
        for name, ctx in contexts.items():
            ids = np.full((ctx.batch, window), 7, dtype=np.int64)
            start = clock()
            ctx.forward(ids)
            if turn:  # the first turn warms up
                samples[name].append(clock() - start)
            ctx.commit(0)
    return samples


def fill(ctx, past: int, chunk: int = 256) -> None:
    tokens = np.random.default_rng(0).integers(3, min(1000, ctx.backend.manifest.architecture.vocab_size), past)
    for start in range(0, past, chunk):
        piece = np.repeat(tokens[start : start + chunk][None], ctx.batch, axis=0)
        ctx.forward(piece)
        ctx.commit(piece.shape[1])


def read_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second streamed from memory by `threads` threads: the best of `repeats` timed sums of
    a buffer far larger than the caches, each thread summing its own slice (numpy's sum releases the GIL)."""
    data = np.ones(megabytes << 18, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for turn in range(repeats + 1):
            start = time.perf_counter()
            list(pool.map(np.sum, parts))
            if turn:  # the first turn faults the pages in
                best = min(best, time.perf_counter() - start)
    return data.nbytes / best


def pass_bytes(weights: int, manifest, variant: str, past: int, window: int, rows: int = 1) -> int:
    """Bytes one pass must move: its weights once, and per row the KV entries its attention reads
    (past + window); the portable graph also writes its whole present (past + window), a copy."""
    arch = manifest.architecture
    entry = (
        2 * arch.num_layers * arch.kv_heads * arch.head_dim * np.dtype(manifest.dtype).itemsize
    )  # key + value, every layer
    entries = past + window if variant == "inplace" else 2 * (past + window)
    return weights + rows * entries * entry


def graph_bytes(graph: Path) -> int:
    """The graph file and its external data (the artifact's shared weights.data, or a legacy PATH.data), if
    any: what a pass reads as weights (the shared file also holds the other graph's few own tensors)."""
    data = [graph.with_name(graph.name + ".data"), graph.with_name("weights.data")]
    return graph.stat().st_size + sum(d.stat().st_size for d in data if d.exists())


@click.command()
@click.argument("artifacts", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--windows", default="1,4,8,16", show_default=True)
@click.option("--pasts", default="0,256,1024", show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--repeats", type=int, default=10, show_default=True)
@click.option("--batches", default="1", show_default=True, help="Rows per pass (the in-place graph's batch engine).")
@click.option(
    "--capacity",
    type=click.IntRange(1),
    default=None,
    help="The cache's capacity (default: just enough). The in-place scatter attention reads all of it.",
)
@click.option(
    "--cpu-time",
    is_flag=True,
    help="Count the process's CPU seconds instead of wall seconds: with --threads 1, "
    "a figure that other processes on a busy machine disturb far less.",
)
@click.option(
    "--graph",
    "graphs",
    multiple=True,
    type=click.Choice(["portable", "inplace"]),
    help="Graph variant(s) to time (repeatable); default: every variant in the manifest.",
)
@click.option(
    "--floor",
    is_flag=True,
    help="Also print each cell's memory floor: the bytes the pass must read "
    "(weights and KV cache) over the read bandwidth measured here with the same threads.",
)
def main(artifacts, windows, pasts, threads, repeats, batches, capacity, cpu_time, graphs, floor):
    """Median milliseconds per window pass, per artifact, graph variant, window and past length."""
    ws = [int(w) for w in windows.split(",")]
    ps = [int(p) for p in pasts.split(",")]
    found = _backends(artifacts, graphs, threads)
    backends = {name: backend for name, (backend, _) in found.items()}
    print(f"{threads} threads; median (min) {'CPU ' if cpu_time else ''}ms of {repeats} passes")
    bs = [int(b) for b in batches.split(",")]
    names = {(v, b): v if bs == [1] else f"{v} x{b}" for v in backends for b in bs}  # batch > 1: the in-place graph
    contexts = {}  # every (variant, past) at once: they all take turns pass by pass
    for past in ps:
        for (v, b), name in names.items():
            contexts[(name, past)] = backends[v].context(capacity or past + max(ws) + 1, batch=b)
            fill(contexts[(name, past)], past)
    cells = {key: [] for key in contexts}
    medians = {}  # (name, past, window) -> median ms
    for w in ws:
        for key, seconds in time_passes(
            contexts, w, repeats, time.process_time if cpu_time else time.perf_counter
        ).items():
            medians[(*key, w)] = statistics.median(seconds) * 1000
            cells[key].append(f"{medians[(*key, w)]:.1f} ({min(seconds) * 1000:.1f})")
    for ctx in contexts.values():
        ctx.close()
    rows = [(name, past, cells[(name, past)]) for name, past in contexts]
    print("| graph | past | " + " | ".join(f"W={w}" for w in ws) + " |")
    print("|---|---|" + "---|" * len(ws))
    for v, past, cells in sorted(rows, key=lambda r: (r[0], r[1])):
        print(f"| {v} | {past} | " + " | ".join(cells) + " |")
    if floor:
        _print_floors(found, names, ps, ws, threads, medians)


def _print_floors(found: dict, names: dict, pasts: list[int], windows: list[int], threads: int, medians: dict) -> None:
    bandwidth = read_bandwidth(threads)
    print(
        f"\nmemory floor, ms (the median above / floor): the bytes a pass must read at {bandwidth / 1e9:.1f} GB/s, "
        f"the read bandwidth measured now with {threads} threads. The CPU's last-level cache can hold part of a "
        "small model's weights between passes, so a pass may beat its floor by a little."
    )
    print("| graph | weights MB | past | " + " | ".join(f"W={w}" for w in windows) + " |")
    print("|---|---|---|" + "---|" * len(windows))
    for (v, b), name in sorted(names.items(), key=lambda item: item[1]):
        backend, graph = found[v]
        weights = graph_bytes(graph)
        for past in pasts:
            floors = [
                pass_bytes(weights, backend.manifest, backend.graph, past, w, b) / bandwidth * 1000 for w in windows
            ]
            cells = [f"{f:.1f} ({medians[(name, past, w)] / f:.2f}x)" for f, w in zip(floors, windows)]
            print(f"| {name} | {weights / 1e6:.0f} | {past} | " + " | ".join(cells) + " |")


def _backends(artifacts, graphs, threads: int) -> dict:
    """(artifact folder name +) variant -> (OrtBackend, its graph file), for every requested variant each
    artifact has."""
    from jacobi_rt.runtime.backends.onnxrt import OrtBackend
    from jacobi_rt.runtime.manifest import load_manifest

    out = {}
    short = [Path(a).name for a in artifacts]
    for artifact in artifacts:
        manifest = load_manifest(artifact, verify=False)
        print(f"{artifact}: {manifest.architecture.family}, {manifest.dtype}, quantization {manifest.quantization}")
        for v in graphs or sorted(manifest.graphs):
            if v in manifest.graphs:
                label = Path(artifact).name if short.count(Path(artifact).name) == 1 else str(artifact)
                name = v if len(artifacts) == 1 else f"{label}/{v}"
                out[name] = (
                    OrtBackend(artifact, manifest, device="cpu", threads=threads, graph=v),
                    Path(artifact) / manifest.graphs[v],
                )
    return out


if __name__ == "__main__":
    main()
