"""The attention variants: grouped, Falcon-routed, and the in-place jacobi::gqa with its ONNX forms."""
