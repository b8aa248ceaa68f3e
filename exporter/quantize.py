"""Weight-only quantization of the exported graph with onnxruntime's MatMulNBits quantizer."""

from __future__ import annotations

from pathlib import Path

BITS = {"int8": 8, "int4": 4}


def quantize_weights(source: Path, target: Path, kind: str, block_size: int = 32) -> None:
    """MatMul weights -> MatMulNBits (symmetric, per block of `block_size`); activations stay float.

    accuracy_level 4 lets the CPU kernel compute with int8 activations, the fast path on x86.
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(source))
    quantizer = MatMulNBitsQuantizer(model, bits=BITS[kind], block_size=block_size, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(target), use_external_data_format=False)
