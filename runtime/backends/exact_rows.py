"""Exact on every CPU: which pass shapes give a row the same bits as every other pass, checked at load.

Jacobi decoding commits a guess when the model's pick for it, computed inside a window, equals the
guess; greedy decoding computes the same pick in a one-token pass. The two are the same decoding
only if a row's logits do not depend on how many rows share its pass, and on a CPU they can:

- A one-row attention. MLAS's SGEMM runs M = 1 against a B that is not a constant (the portable
  graph's attention matmuls: Q K^T and P V per head, M = the window) on a kernel of its own
  (`KernelM1Routine`), whose sums differ in the last bits from the many-row kernel's (onnxruntime
  1.32, AMD EPYC with AVX2: 9.5e-6 at K = 64, 3.8e-5 at K = 576; every M >= 2 gives a row the same
  bits). GroupQueryAttention (the in-place graph) has a one-token path of its own too, which the
  exporter's extra attention row keeps every pass off (exporter/attention/gqa_rows.py: float and level-4
  exports since 2026-12-06). So float32 artifacts without it are not exact as the passes come either:
  SmolLM2's float artifact left greedy at token 30 of a prompt with a 6-layer draft (CI, 2026-12-03).
- A one-row MatMulNBits tile (int8 activations, accuracy level 4). MLAS cuts a MatMulNBits of M rows
  into tiles of 128 rows (MlasQNBitGemmBatch), and on x86-64 with AVX2 but no AVX-512 a tile of
  exactly one row of 4-bit weights in blocks of 32 or more takes a one-row kernel
  (`SQ4BitGemmKernel_BlkSum_CompInt8_avx2`: `BlkLen >= 32 && CountM == 1`) that folds the weights'
  zero point in integers where the many-row kernel adds the block sums in a float GEMM: the last
  bits differ (1.6e-6 on one matmul), and 30 layers of int8 rounding turn them into other greedy
  ids. A row in a tile of two or more rows is bitwise the same row in any other such tile.

So a pass of width 1, or whose rows * window would leave a one-row tile, gets one more window column
(`pad`): a copy of each row's last token that no real row attends to (it is last, and the window is
causal), whose cache entry lands one past the window and is never committed. Padding costs a pass
one token a row, so it is paid only where it is needed: at load, `check` runs a short chain window
and the same tokens one pass at a time and compares the logits bit for bit, as the passes come
("native"), then padded ("padded"). If neither is exact on this CPU, only greedy decoding is (its
passes are all alike): the strategies that guess run greedy there ("greedy"), with a warning.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .local_cache import cache_root, entry_key

TILE = 128  # MLAS's rows per MatMulNBits task (onnxruntime 1.32, qnbitgemm.cpp StrideM)

NATIVE, PADDED, GREEDY, UNCHECKED = "native", "padded", "greedy", "unchecked"
MODES = {
    NATIVE: "windows are bitwise one-token passes on this CPU",
    PADDED: "one-token passes run as two tokens, so that windows are bitwise one-token passes on this CPU",
    GREEDY: "no pass shape is exact on this CPU: every strategy decodes greedily here",
    UNCHECKED: "not checked (a draft's passes only guess, and TensorRT runs its own kernels)",
}
PROMPT, WINDOW = 5, 6  # the check's tokens: a short prefill, then one chain window
# The instruction sets that pick MLAS's kernels (x86-64 flags, ARM64 features), as /proc/cpuinfo names them
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "asimddp", "i8mm", "sve")


def cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one {field: value} per processor block (none where it cannot be read)."""
    try:
        blocks = Path("/proc/cpuinfo").read_text().split("\n\n")
    except OSError:
        return []
    lines = [[line.partition(":") for line in block.splitlines()] for block in blocks]
    return [{key.strip(): value.strip() for key, _, value in block} for block in lines if block]


@lru_cache(maxsize=1)
def cpu() -> str:
    """This CPU as the check's result depends on it: its model name and the instruction sets that choose
    MLAS's kernels, e.g. "AMD EPYC (x86_64: avx2 fma avx512f avx512_vnni)" (read from /proc/cpuinfo)."""
    fields = {key: value for block in reversed(cpuinfo()) for key, value in block.items()}  # the first processor's
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    listed = " ".join(f for f in KERNEL_FLAGS if f in flags)
    return f"{name} ({platform.machine()}{': ' + listed if listed else ''})"


@dataclass(frozen=True)
class RowsCheck:
    """What the load-time check found: the mode every pass of this backend runs in, and its cost."""

    mode: str  # one of MODES
    seconds: float = 0.0
    cpu: str = field(default_factory=cpu)
    cached: bool = False  # read back from an earlier load's check (verdict_path)

    @property
    def exact_windows(self) -> bool:
        """Whether a window's rows may be committed as guesses (else: greedy only)."""
        return self.mode != GREEDY

    def line(self) -> str:
        took = (
            ", as checked at an earlier load"
            if self.cached
            else f", checked in {self.seconds * 1000:.0f} ms"
            if self.seconds
            else ""
        )
        return f"exactness: {self.mode}: {MODES[self.mode]} ({self.cpu}{took})"


def needs_pad(rows: int, window: int, extra_row: bool = False) -> bool:
    """Whether a pass of `rows` x `window` tokens would run a one-row attention or leave a matmul a tile of one
    row. With the in-place graph's extra attention row (gqa_rows.py) attention never runs one row, so a
    one-token pass of two or more rows (the batcher's greedy rows) runs as it comes: padding it would double
    its matmuls' rows (16 int4 greedy rows: 1.45x the tokens/s unpadded, docs/bench/2026-12-06-batch-pad.md)."""
    return (window == 1 and not extra_row) or rows * window % TILE == 1


def pad(ids: np.ndarray, positions: np.ndarray, window_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One more window column: each row's last token again, at its position (so no position past the
    context is asked for), attending to its row's window; the real rows do not see it."""
    rows, window = ids.shape
    ids = np.concatenate([ids, ids[:, -1:]], axis=1)
    positions = np.concatenate([positions, positions[:, -1:]], axis=1)
    mask = np.zeros((rows, window + 1, window + 1), dtype=bool)
    mask[:, :window, :window] = window_mask
    mask[:, window] = True
    return ids, positions, mask


def check(backend) -> RowsCheck:
    """The mode in which this backend's windows are bitwise one-token passes here; sets backend.pad_rows.
    A verdict found before for the same graph files, CPU, onnxruntime and threads is read back (see
    verdict_path): the check runs passes, about a second each at 8B."""
    path = verdict_path(backend)
    cached = _read_verdict(path)
    if cached is not None:
        backend.pad_rows = cached == PADDED
        return RowsCheck(cached, cached=True)
    found = _run_check(backend)
    _write_verdict(path, found.mode)
    return found


def verdict_path(backend) -> Path | None:
    """Where the check's verdict for this backend is kept: $JACOBI_RT_CACHE (default
    $XDG_CACHE_HOME/jacobi-rt, else ~/.cache/jacobi-rt)/exact-rows/<key>.json, the key a sha256 of every
    input the verdict depends on as far as this process can tell; None when JACOBI_RT_CACHE=off. The CPU
    is read from /proc/cpuinfo, which an emulator (qemu-user) does not change: set it off there."""
    root = cache_root()
    if root is None:
        return None
    import onnxruntime

    manifest = backend.manifest
    graph = manifest.graphs[backend.graph]
    inputs = {
        "files": {name: manifest.files[name] for name in sorted(manifest.files) if name.endswith((".onnx", ".data"))},
        "graph": graph,
        "cpu": cpu(),
        "onnxruntime": onnxruntime.__version__,
        "threads": backend.threads,
        "check": [PROMPT, WINDOW, TILE],
    }
    return root / "exact-rows" / f"{entry_key(inputs)}.json"


def _read_verdict(path: Path | None) -> str | None:
    try:
        mode = json.loads(path.read_text())["mode"] if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return mode if mode in (NATIVE, PADDED, GREEDY) else None


def _write_verdict(path: Path | None, mode: str) -> None:
    if path is None:
        return
    try:  # a cache that cannot be written costs the next load the check, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"mode": mode, "cpu": cpu()}))
        temporary.replace(path)
    except OSError:
        pass


def _run_check(backend) -> RowsCheck:
    started = time.perf_counter()
    vocab = backend.manifest.architecture.vocab_size
    tokens = (np.arange(1, PROMPT + WINDOW + 1, dtype=np.int64) * 7919) % vocab  # any ids: the check is bitwise
    for mode, padding in ((NATIVE, False), (PADDED, True)):
        backend.pad_rows = padding
        if _window_is_one_token_passes(backend, tokens):
            return RowsCheck(mode, time.perf_counter() - started)
    backend.pad_rows = False  # greedy's one-token passes are all alike: no padding needed
    return RowsCheck(GREEDY, time.perf_counter() - started)


def _window_is_one_token_passes(backend, tokens: np.ndarray) -> bool:
    prompt, chain = tokens[:PROMPT], tokens[PROMPT:]
    with backend.context(len(tokens)) as ctx:
        ctx.forward(prompt[None])
        ctx.commit(len(prompt))
        window = ctx.forward(chain[None], want_logits=True).logits[0]
        ctx.commit(0)
        for row, token in enumerate(chain):
            alone = ctx.forward(np.array([[token]]), want_logits=True).logits[0, 0]
            ctx.commit(1)
            if not np.array_equal(alone, window[row]):
                return False
    return True
