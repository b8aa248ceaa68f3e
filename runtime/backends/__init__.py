"""Runtime backends: each runs the window graph and owns its KV cache on its device."""
