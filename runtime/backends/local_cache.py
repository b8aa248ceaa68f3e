"""Where the runtime keeps what it learns about an artifact on this machine: $JACOBI_RT_CACHE.

The default is $XDG_CACHE_HOME/jacobi-rt, else ~/.cache/jacobi-rt; JACOBI_RT_CACHE=off keeps nothing.
Each kind of entry has a folder of its own (`exact-rows/`: a load's exactness verdict; `sessions/`: a
graph optimized and prepacked for this CPU), each entry named by the sha256 of what it depends on.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path | None:
    """The cache's folder, or None when JACOBI_RT_CACHE=off."""
    root = os.environ.get("JACOBI_RT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / (
        "jacobi-rt"
    )
    return None if str(root) == "off" else Path(root)


def entry_key(inputs: dict) -> str:
    """The sha256 of an entry's inputs (any JSON-serialisable record)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
