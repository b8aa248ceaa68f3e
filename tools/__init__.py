"""The jacobi-rt command line and tools."""
