"""A graph's initializers read one at a time from wherever they are stored, and written to a shared weights file.

The weight pass loads a graph file without its external data: each weight is memory-mapped from
the file its proto names (`weights.data`, a legacy `model.onnx.data`) or decoded when inline, only
when it is quantized or copied, and dropped after. A tied LM head's folded Transpose is recorded,
not computed: the candidate it makes is the embedding table itself. What the pass keeps as it was
(norms, biases, a float embedding) is copied into the artifact's one weights file beside the
quantized arrays, so the float data files can go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .weight_file import WeightFile, point_at, read_external

INLINE_BELOW = 1024  # bytes: shapes, axes, epsilons stay in the graph file


def nbytes(proto) -> int:
    from onnx import helper

    return (
        int(np.prod(proto.dims, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type)).itemsize
    )


def raw_bytes(array: np.ndarray) -> memoryview:
    """An array's bytes in C order without a copy when it is contiguous already (a mapped tensor)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def data_files(graph: Path) -> list[str]:
    """The external data files a graph file's initializers name, in order of first use."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    found = (e.value for i in model.graph.initializer for e in i.external_data if e.key == "location")
    return list(dict.fromkeys(found))


class GraphWeights:
    """The initializer values of one graph file, read on demand."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._transposed: dict[str, tuple[object, list[int] | None]] = {}  # folded name -> (source proto, perm)

    def read(self, proto) -> np.ndarray:
        """proto's values: a view of the mapped file where stored externally, of its source for a folded transpose."""
        if proto.name in self._transposed:
            source, perm = self._transposed[proto.name]
            values = self.read(source)
            return values.transpose(*perm) if perm else values.T
        return read_external(self.folder, proto)

    def stored(self, proto):
        """Where proto's values are stored, (file, offset, dims, perm), equal for two graph files that read the
        same bytes the same way; None for an inline one."""
        from onnx import TensorProto

        if proto.name in self._transposed:
            source, perm = self._transposed[proto.name]
            inner = self.stored(source)
            return None if inner is None else (*inner, tuple(perm or ()) or "T")
        if proto.data_location != TensorProto.EXTERNAL:
            return None
        info = {e.key: e.value for e in proto.external_data}
        return (str((self.folder / info["location"]).resolve()), int(info.get("offset", 0)), tuple(proto.dims))

    def transposed(self, source, name: str, perm: list[int] | None):
        """A proto `name` holding source's values transposed by perm (None: reversed), read when needed."""
        from onnx import TensorProto

        dims = list(source.dims)
        order = perm or list(range(len(dims)))[::-1]
        proto = TensorProto(name=name, data_type=source.data_type, dims=[dims[a] for a in order])
        self._transposed[name] = (source, perm)
        return proto

    def inline_small(self, model) -> None:
        """Decode external initializers under INLINE_BELOW bytes into the graph (the graph rewrites read them)."""
        from onnx import TensorProto, numpy_helper

        for init in model.graph.initializer:
            if init.data_location == TensorProto.EXTERNAL and nbytes(init) < INLINE_BELOW:
                init.CopyFrom(numpy_helper.from_array(np.array(self.read(init)), init.name))

    def write_rest(self, model, out: WeightFile, written: set[str]) -> None:
        """Every initializer of INLINE_BELOW bytes or more not already in `out` (names in `written`) into
        `out`: kept float weights read from the source, inline ones (rotary tables) moved out of the graph."""
        from onnx import TensorProto, numpy_helper

        for init in model.graph.initializer:
            if init.name in written:
                continue
            if init.name in self._transposed:  # a folded transpose left float: computed now, one tensor
                values = np.ascontiguousarray(self.read(init))
            elif nbytes(init) < INLINE_BELOW:
                continue
            else:
                external = init.data_location == TensorProto.EXTERNAL
                values = self.read(init) if external else numpy_helper.to_array(init)
            if nbytes(init) < INLINE_BELOW:
                init.CopyFrom(numpy_helper.from_array(values, init.name))
            else:
                point_at(init, out.name, out.add(raw_bytes(values)))
            del values
