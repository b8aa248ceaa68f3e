"""Weight-only quantization of the exported graph with onnxruntime's MatMulNBits quantizer."""

from __future__ import annotations

from pathlib import Path

BITS = {"int8": 8, "int4": 4}


def quantize_weights(source: Path, target: Path, kind: str, block_size: int = 32) -> None:
    """MatMul weights -> MatMulNBits (symmetric, per block of `block_size`); activations stay float.

    accuracy_level 4 lets the CPU kernel compute with int8 activations, the fast path on x86.
    """
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(source))
    fold_transposed_weights(model)
    quantizer = MatMulNBitsQuantizer(model, bits=BITS[kind], block_size=block_size, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=False)


def fold_transposed_weights(model) -> int:
    """Replace MatMul(x, Transpose(W)) by MatMul(x, W^T) with W^T stored as its own initializer.

    A tied LM head reads the embedding table through a Transpose; the quantizer only sees
    MatMuls whose weight is an initializer, so without this the largest matrix stays float.
    The embedding Gather keeps the original table.
    """
    from onnx import numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    folded = 0
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in initializers:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(u.op_type != "MatMul" or list(u.input).index(node.output[0]) != 1 for u in users):
            continue
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        weight = numpy_helper.to_array(initializers[node.input[0]])
        transposed = weight.transpose(*perm[0]) if perm else weight.T
        graph.initializer.append(numpy_helper.from_array(transposed.copy(), node.output[0]))
        graph.node.remove(node)
        folded += 1
    return folded
