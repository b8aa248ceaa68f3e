"""Safetensors shards written tensor by tensor, chunk by chunk: memory stays at a chunk, whatever the model.

The format (safetensors' own description): an 8-byte little-endian header length, a JSON header
mapping each tensor's name to its dtype, shape and [begin, end) byte offsets in the data that
follows (plus `__metadata__`), padded with spaces to a multiple of 8, then the raw little-endian
bytes. All shapes are known before any value is drawn, so each shard's header is written first and
its tensors streamed after it. More than one shard: `model-0000i-of-0000N.safetensors` and
`model.safetensors.index.json` (Hugging Face's `weight_map`); one shard: `model.safetensors`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .random_shapes import TensorSpec

DTYPES = {"bf16": ("BF16", 2), "fp16": ("F16", 2), "fp32": ("F32", 4)}
INDEX_NAME = "model.safetensors.index.json"


@dataclass
class Shard:
    file: str
    specs: list[tuple[int, TensorSpec]]  # (index in the model, tensor)

    def nbytes(self, itemsize: int) -> int:
        return sum(_count(s.shape) * itemsize for _, s in self.specs)


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_shards(specs: list[TensorSpec], dtype: str, max_bytes: int) -> list[Shard]:
    """Tensors in order, a new shard whenever the next would pass `max_bytes` (a bigger tensor gets its own)."""
    itemsize = DTYPES[dtype][1]
    groups: list[list[tuple[int, TensorSpec]]] = [[]]
    size = 0
    for index, spec in enumerate(specs):
        nbytes = _count(spec.shape) * itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((index, spec))
        size += nbytes
    if len(groups) == 1:
        return [Shard("model.safetensors", groups[0])]
    n = len(groups)
    return [Shard(f"model-{i + 1:05d}-of-{n:05d}.safetensors", g) for i, g in enumerate(groups)]


def header_bytes(shard: Shard, dtype: str) -> bytes:
    name, itemsize = DTYPES[dtype]
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for _, spec in shard.specs:
        end = offset + _count(spec.shape) * itemsize
        header[spec.name] = {"dtype": name, "shape": list(spec.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


Chunks = Callable[[int, TensorSpec], Iterator[np.ndarray]]  # (index, spec) -> the encoded values, in chunks


def write_shards(folder: Path, shards: list[Shard], dtype: str, chunks: Chunks, progress=None) -> list[Path]:
    """Write every shard (and the index when there are several); `progress.update(nbytes)` per chunk."""
    written = []
    for shard in shards:
        path = folder / shard.file
        with open(path, "wb") as f:
            f.write(header_bytes(shard, dtype))
            for index, spec in shard.specs:
                if progress is not None:
                    progress.set_postfix_str(f"{shard.file}: {spec.name}", refresh=False)
                for block in chunks(index, spec):
                    f.write(memoryview(np.ascontiguousarray(block)).cast("B"))
                    if progress is not None:
                        progress.update(block.nbytes)
        written.append(path)
    if len(shards) > 1:
        itemsize = DTYPES[dtype][1]
        index = {
            "metadata": {"total_size": sum(s.nbytes(itemsize) for s in shards)},
            "weight_map": {spec.name: s.file for s in shards for _, spec in s.specs},
        }
        (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        written.append(folder / INDEX_NAME)
    return written
