"""How the runtime opens an onnxruntime session: its options, and on the CPU, opt-in, a mapped session.

A mapped session: the graph optimized and prepacked for this CPU once, then memory-mapped by every load.

onnxruntime prepacks constant weights when it creates a session: it copies every MatMul and MatMulNBits
weight into its kernels' layout, in anonymous memory. At 8B that is most of the load and more memory than
the weights: at accuracy level 4 MatMulNBits adds a float32 sum per block (int4 blocks + scales + sums =
1.17x the weights), and it keeps the source scales resident beside them.

With `session.save_external_prepacked_constant_initializers`, a session saves its optimized graph with
the packed weights in an external-data file. A session made from that file maps them: it packs nothing,
and its weights are clean file pages (the page cache's, shared by the processes of a host that load the
artifact, e.g. Ray replicas). The entry is written by a child process, so the process that generates never
holds the anonymous copy, not even at its first load.

    $JACOBI_RT_CACHE/sessions/<key>/
      graph.onnx     the optimized graph (this CPU's layouts: the key names the CPU)
      graph.data     its initializers, the prepacked ones included
      source.json    what it was made from, so that a re-exported artifact replaces its old entry

The key: the graph's and weights' manifest digests, sizes and modification times, the CPU and its
kernel-choosing flags, onnxruntime's version. A session from an entry computes the same bits as one from
the artifact (tests/runtime/backends/test_ort_session.py). Measured at 8B (docs/bench/2026-12-06-mapped-sessions.md):
loads in half the time, two processes cost the host one copy (0.52x), the same peak RSS (the source scales are
still read), decode 0.93x (cause open: not huge pages), disk 2.2x the int4 weights: hence opt-in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from ..manifest import Manifest
from .exact_rows import cpu
from .local_cache import cache_root, entry_key

GRAPH, DATA, SOURCE = "graph.onnx", "graph.data", "source.json"
FORMAT = 1  # bump when what an entry holds changes
STALE = 24 * 3600  # seconds after which an entry still being made was left by a killed load


def session_options(ort, threads: int):
    """How the runtime runs a graph: every onnxruntime optimization, one sequential stream of nodes,
    `threads` intra-op threads (benchmarks/op_profile.py profiles a pass with the same)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def open_session(ort, folder: Path, manifest: Manifest, graph: str, options, providers: list[str], mapped: bool):
    """A session of `folder`'s `graph` with `options`: with `mapped`, the mapped one on the CPU provider when
    the cache is on, else (or when the entry cannot be made or loaded) the artifact's graph as it is.
    Returns the session and the graph file it was made from."""
    on_cpu = providers == ["CPUExecutionProvider"]
    cached = mapped_graph(folder, manifest, graph, options.intra_op_num_threads) if mapped and on_cpu else None
    if cached is not None:
        level = options.graph_optimization_level
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # done before it was saved
        try:
            return ort.InferenceSession(str(cached), sess_options=options, providers=providers), cached
        except Exception as exc:  # onnxruntime raises its own types; the entry is remade at the next load
            warnings.warn(
                f"the mapped session {cached.parent} did not load ({exc}); loading the graph as it is", stacklevel=4
            )
            forget(cached.parent)
            options.graph_optimization_level = level
    source = folder / manifest.graphs[graph]
    return ort.InferenceSession(str(source), sess_options=options, providers=providers), source


def mapped_graph(folder: Path, manifest: Manifest, graph: str, threads: int) -> Path | None:
    """The cached optimized graph of `folder`'s `graph` for this CPU, made now if missing (about the time
    of one session's creation, in a child process); None when the cache is off or the entry could not be
    made (then the caller loads the artifact's graph as it is)."""
    try:
        entry = entry_folder(folder, manifest, graph)
    except OSError:  # a file the manifest names is missing: loading the graph itself says which
        return None
    if entry is None:
        return None
    if not (entry / SOURCE).exists():  # written last: an entry without it is incomplete
        try:
            _make(folder / manifest.graphs[graph], entry, threads)
        except (OSError, subprocess.SubprocessError) as exc:
            warnings.warn(
                f"could not prepare a mapped session in {entry} ({exc}); loading the graph as it is", stacklevel=4
            )
            return None
    return entry / GRAPH


def entry_folder(folder: Path, manifest: Manifest, graph: str) -> Path | None:
    """Where the mapped session of `folder`'s `graph` is kept; None when JACOBI_RT_CACHE=off."""
    root = cache_root()
    if root is None:
        return None
    import onnxruntime

    graph_file = manifest.graphs[graph]
    names = sorted(name for name in manifest.files if name == graph_file or name.endswith(".data"))
    stats = {name: _stat(folder / name) for name in names}
    inputs = {
        "files": {name: manifest.files[name] for name in names},
        "stats": stats,
        "graph": graph_file,
        "cpu": cpu(),
        "onnxruntime": onnxruntime.__version__,
        "format": FORMAT,
    }
    return root / "sessions" / entry_key(inputs)


def forget(entry: Path) -> None:
    """Remove an entry that failed to load (the next load makes it again)."""
    shutil.rmtree(entry, ignore_errors=True)


def _stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _make(source: Path, entry: Path, threads: int) -> None:
    """Write the entry into a temporary folder beside it, then rename it into place (two loads racing to
    make it: the second rename fails and its copy is dropped), and remove older entries of the same graph."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name[:12]}-", dir=entry.parent))
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(source), str(staging / GRAPH), str(threads)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:]
            raise subprocess.SubprocessError(last[0] if last else f"exit {done.returncode}")
        (staging / SOURCE).write_text(json.dumps({"graph": str(source.resolve())}))
        _drop_older(entry, source.resolve())
        os.replace(staging, entry)
    except OSError:
        if not (entry / SOURCE).exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _drop_older(entry: Path, source: Path) -> None:
    """An artifact re-exported in place leaves its old entry behind: one entry per source graph is kept (and
    no half-made entry older than a day)."""
    for old in entry.parent.iterdir():
        try:  # another load may remove an entry while we look at it
            if old.name.startswith("."):  # an entry being made, or left by a load killed while making it
                if time.time() - old.stat().st_mtime > STALE:
                    shutil.rmtree(old, ignore_errors=True)
            elif old != entry and json.loads((old / SOURCE).read_text())["graph"] == str(source):
                shutil.rmtree(old, ignore_errors=True)  # not this one: a load beside ours made it
        except (OSError, ValueError, KeyError, TypeError):
            continue


def _save(source: str, target: str, threads: int) -> None:
    """(The child process) create a session of `source` as the runtime does, saving its optimized graph
    and prepacked weights to `target` and its data file."""
    import onnxruntime as ort

    options = session_options(ort, threads)
    options.log_severity_level = 3  # its warning that the saved graph fits this CPU only: the key names the CPU
    options.optimized_model_filepath = target
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])


if __name__ == "__main__":
    _save(sys.argv[1], sys.argv[2], int(sys.argv[3]))
