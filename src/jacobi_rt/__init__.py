"""jacobi-rt: Jacobi and speculative Jacobi decoding, exported to ONNX and TensorRT, run without PyTorch."""

__version__ = "0.1.0"
