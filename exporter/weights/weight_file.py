"""One external-data file for every graph of an artifact: each distinct tensor is stored once.

ONNX external data records a file, an offset and a length per initializer, so the portable and
the in-place graph can point at the same bytes: the artifact holds one copy of its weights. A
tensor is written once per key: a provenance key when the caller has one (the source tensor and
its transform: nothing is read to find that it is already stored), else the sha256 of its bytes.
Tensors of ALIGN_ABOVE bytes or more start at a multiple of ALIGN, so a reader may map them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "weights.data"
ALIGN = 1 << 16
ALIGN_ABOVE = 1 << 20


@dataclass(frozen=True)
class Stored:
    """Where a tensor's bytes are in the weights file."""

    offset: int
    length: int


class WeightFile:
    """The artifact's weights file, written in append order; `close()` when every graph is saved."""

    def __init__(self, folder: Path, name: str = WEIGHTS_FILE):
        self.path = Path(folder) / name
        self.name = name
        self._file = open(self.path, "wb")
        self._stored: dict[Hashable, Stored] = {}
        self.size = 0

    def put(self, key: Hashable, produce: Callable[[], np.ndarray | bytes]) -> Stored:
        """The stored place of `key`, producing and writing its bytes only the first time."""
        if key not in self._stored:
            self._stored[key] = self.add(produce())
        return self._stored[key]

    def add(self, data: np.ndarray | bytes) -> Stored:
        """Write `data` (little-endian, C order) unless the same bytes are stored already."""
        raw = (
            data
            if isinstance(data, (bytes, bytearray, memoryview))
            else memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        )
        digest = ("sha256", hashlib.sha256(raw).digest())
        if digest in self._stored:
            return self._stored[digest]
        if len(raw) >= ALIGN_ABOVE and self.size % ALIGN:
            pad = ALIGN - self.size % ALIGN
            self._file.write(b"\0" * pad)
            self.size += pad
        stored = Stored(self.size, len(raw))
        self._file.write(raw)
        self.size += len(raw)
        self._stored[digest] = stored
        return stored

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def point_at(proto, location: str, stored: Stored) -> None:
    """Make the onnx TensorProto `proto` read its data from `location` at `stored` (its own data dropped)."""
    from onnx import TensorProto

    proto.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        proto.ClearField(field)
    del proto.external_data[:]
    proto.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(stored.offset)), ("length", str(stored.length))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value


def read_external(folder: Path, proto) -> np.ndarray:
    """An initializer's array, memory-mapped from its external data file (or decoded when inline)."""
    from onnx import TensorProto, helper, numpy_helper

    if proto.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(proto)
    info = {e.key: e.value for e in proto.external_data}
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type))
    count = int(np.prod(proto.dims, dtype=np.int64))
    array = np.memmap(
        Path(folder) / info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)), shape=(count,)
    )
    return array.reshape(tuple(proto.dims))
