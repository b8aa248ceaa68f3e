"""Building the window graph: the trace, its stitched layers, and the graph rewrites."""
