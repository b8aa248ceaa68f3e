"""A batcher's size when none is asked for: its rows (slots) and each row's context.

Slots: as many rows as fill a share of the available memory with their KV caches at the batch context,
at most DEFAULT_SLOTS (a CPU pass of more rows costs more than they gain: benchmarks/load_bench.py); one
where a backend's context holds one row. Context: the artifact's, except on the in-place graph's
`scatter` attention (where GroupQueryAttention refuses the head size), which reads the whole capacity
every pass (16 rows of one token, SmolLM2: 148 ms at capacity 256, 237 at 2048, 495 at 8192), so it is
capped at DEFAULT_BATCH_CONTEXT there.
"""

from __future__ import annotations

import os
from pathlib import Path

from .backends.base import Backend

DEFAULT_BATCH_CONTEXT = 2048  # a batcher's slot context on a graph whose attention reads the whole capacity
DEFAULT_SLOTS = 16  # the server's slots at most, unless asked: 16 rows of one token cost ~2.8 one-row passes on a CPU


def batch_context(backend: Backend, max_context: int) -> int | None:
    """Each row's context on a batcher of `backend` (None: the artifact's, `max_context`)."""
    if backend.manifest.inplace_attention == "scatter" and backend.batched:
        return min(max_context, DEFAULT_BATCH_CONTEXT)
    return None


def default_slots(backend: Backend, max_context: int, memory_share: float = 0.25) -> int:
    """The rows whose KV caches at the batch context fill `memory_share` of the available memory, 1..DEFAULT_SLOTS."""
    if not backend.batched:
        return 1
    arch, dtype = backend.manifest.architecture, backend.manifest.dtype
    per_entry = 2 * arch.num_layers * arch.kv_heads * arch.head_dim * (4 if dtype == "float32" else 2)
    row_bytes = per_entry * min(max_context, DEFAULT_BATCH_CONTEXT)
    return max(1, min(DEFAULT_SLOTS, int(available_memory() * memory_share // row_bytes)))


def available_memory() -> int:
    """Bytes the kernel says a new allocation can have without swapping (MemAvailable), or, where there
    is no /proc/meminfo, the machine's physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
