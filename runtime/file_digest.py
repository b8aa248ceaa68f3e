"""What the manifest records of each file, and the load-time check that reads a few MB instead of every byte.

At export every file gets its full sha256 and a *sampled digest*: its size plus the sha256 of
BLOCKS blocks of BLOCK_SIZE bytes at fixed offsets spread evenly from the first byte to the last
(the whole file when it is smaller than that). At load (`verify="sampled"`, the default) the size
and the sampled digest are checked: 4 MiB read per file, whatever its size. A truncated or extended
file, or a change inside a sampled block, is refused; a change elsewhere in a file larger than
4 MiB is NOT seen at load, only by the full check (`jacobi-rt verify DIR`, `verify="full"`), which
hashes every byte against the recorded sha256. Files recorded without a sampled digest (manifests
written before it) get the full check at load.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

BLOCKS = 64
BLOCK_SIZE = 1 << 16  # 64 KiB: 4 MiB per file in all
MODES = ("sampled", "full", "none")


@dataclass(frozen=True)
class FileSample:
    size: int
    sampled_sha256: str
    blocks: int = BLOCKS
    block_size: int = BLOCK_SIZE

    def to_dict(self) -> dict:
        return asdict(self)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sample_offsets(size: int, blocks: int, block_size: int) -> list[int]:
    """Where the sampled blocks start: the first and last block of the file and evenly between; [0] when it is small."""
    if size <= blocks * block_size:
        return [0]
    last = size - block_size
    return [i * last // max(blocks - 1, 1) for i in range(blocks)]


def sampled_sha256(path: Path, size: int, blocks: int = BLOCKS, block_size: int = BLOCK_SIZE) -> str:
    """sha256 over the size and the sampled blocks (the whole file when it is no bigger than the blocks)."""
    h = hashlib.sha256(f"size {size}\n".encode())
    whole = size <= blocks * block_size
    with open(path, "rb") as f:
        for offset in sample_offsets(size, blocks, block_size):
            f.seek(offset)
            h.update(f.read(size if whole else block_size))
    return h.hexdigest()


def sample_file(path: Path) -> FileSample:
    size = path.stat().st_size
    return FileSample(size, sampled_sha256(path, size))


def file_records(folder: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """For the manifest: every file of the folder -> sha256 (`files`) and -> its FileSample (`samples`)."""
    paths = [p for p in sorted(Path(folder).iterdir()) if p.is_file()]
    return {p.name: sha256_file(p) for p in paths}, {p.name: sample_file(p).to_dict() for p in paths}


def matches_sample(path: Path, record: dict) -> bool:
    """Size and sampled digest equal to the record (read with the record's own block count and size)."""
    size = path.stat().st_size
    return (
        size == record["size"]
        and sampled_sha256(path, size, record["blocks"], record["block_size"]) == record["sampled_sha256"]
    )
