"""Checking the exported graphs against PyTorch (or the portable ONNX graph): whole, staged, or layer by layer."""
