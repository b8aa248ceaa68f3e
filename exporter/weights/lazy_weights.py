"""Weights bound to a traced graph by reference, read from the model's source as they are written.

The trace runs on a skeleton whose parameters hold no data (skeleton.py), so the graph it
gives has one placeholder initializer per parameter. `bind` turns each into a lazy tensor that
reads its parameter from the source; `fold_transposes` stores MatMul's transposed weights the
same way (onnxscript's constant folding would compute every one and keep it in memory: the
whole model twice); `externalize` writes each initializer into the artifact's weights file, one
at a time, and leaves the graph pointing there. Peak memory: the largest tensor, a few times.

    trace (placeholders) -> bind -> fold_transposes -> optimize -> externalize -> save
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .weight_file import WeightFile

Read = Callable[[str], np.ndarray]  # parameter name -> its array in the export dtype
EXTERNAL_ABOVE = 1024  # bytes: smaller initializers (shapes, axes, scalars) stay inside the graph file


def _lazy(produce: Callable[[], np.ndarray], dtype, shape, name: str, origin: tuple):
    """An onnx_ir lazy tensor with `origin` (parameter, permutation) recorded."""
    import onnx_ir as ir

    tensor = ir.LazyTensor(lambda: ir.tensor(produce()), dtype=dtype, shape=ir.Shape(shape), name=name)
    tensor.meta["jacobi_origin"] = origin
    return tensor


def origin(tensor) -> tuple | None:
    """(parameter name, permutation or None) of a bound initializer; None for any other tensor."""
    meta = getattr(tensor, "meta", None)
    return meta.get("jacobi_origin") if meta is not None else None


def bind(model, read: Read, parameters: dict[str, str]) -> int:
    """Replace the initializers named in `parameters` (initializer -> parameter name) by lazy reads; return how many."""
    bound = 0
    for value in model.graph.initializers.values():
        key = parameters.get(value.name)
        if key is not None and value.const_value is not None:
            like = value.const_value
            value.const_value = _lazy(lambda k=key: read(k), like.dtype, like.shape, value.name, (key, None))
            bound += 1
    return bound


def fold_transposes(model) -> int:
    """Transpose(bound weight) -> a lazy initializer of the transposed weight, named as the Transpose's output.

    Exactly the Transposes onnxscript's folding takes whatever their size (its always-fold rule:
    the weight read by this node alone), so the optimized graph is the one it would give."""
    import onnx_ir as ir

    graph = model.graph
    folded = []
    for node in graph:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 1:
            continue
        (source,) = node.inputs
        found = origin(source.const_value) if source is not None and source.is_initializer() else None
        if found is None or len(source.uses()) != 1 or found[1] is not None:
            continue
        rank = len(source.const_value.shape)
        attribute = node.attributes.get("perm")
        perm = tuple(attribute.value) if attribute is not None else tuple(reversed(range(rank)))
        parent, out = source.const_value, node.outputs[0]
        shape = [parent.shape[i] for i in perm]
        tensor = _lazy(
            lambda p=parent, q=perm: np.ascontiguousarray(np.transpose(p.numpy(), q)),
            parent.dtype,
            shape,
            out.name,
            (found[0], perm),
        )
        value = ir.Value(name=out.name, shape=ir.Shape(shape), type=ir.TensorType(parent.dtype), const_value=tensor)
        folded.append((node, out, value, source))
    for node, out, value, source in folded:
        out.replace_all_uses_with(value)
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        if not source.uses():
            graph.initializers.pop(source.name)
    return len(folded)


def _array(tensor) -> np.ndarray:
    """The tensor's data as an array, without the copy `tobytes()` makes (bfloat16 and other non-numpy types: bytes)."""
    try:
        return tensor.numpy()
    except (TypeError, ValueError):
        return np.frombuffer(tensor.tobytes(), np.uint8)


def externalize(model, weights: WeightFile, progress: Callable[[], None] | None = None) -> int:
    """Write every initializer of EXTERNAL_ABOVE bytes or more into `weights` and point the graph at it.

    Bound tensors are stored once per (parameter, permutation, dtype) across every graph written
    to `weights` (nothing is read for a tensor stored already); others once per content."""
    import onnx_ir as ir

    written = 0
    for value in list(model.graph.initializers.values()):
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.nbytes < EXTERNAL_ABOVE:
            continue
        found = origin(tensor)
        produce = lambda t=tensor: _array(t)  # noqa: E731
        stored = weights.put((found, tensor.dtype), produce) if found is not None else weights.add(_array(tensor))
        value.const_value = ir.ExternalTensor(
            weights.name,
            stored.offset,
            stored.length,
            tensor.dtype,
            shape=ir.Shape(tensor.shape),
            name=value.name,
            base_dir=str(weights.path.parent),
        )
        written += 1
        if progress:
            progress()
    return written
