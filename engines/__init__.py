"""TensorRT engines built from an artifact's ONNX (GPU only)."""
