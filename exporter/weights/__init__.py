"""The weights: read from the model source, written to the artifact's weights file, quantized by the weight pass."""
