"""Measuring scripts, outside the wheel: each one `python -m benchmarks.NAME` from the repository root.

They time, profile and compare what the package does (the figures under docs/bench/); `jacobi-rt bench`
is the product's own benchmark and lives in the package (jacobi_rt.tools.bench)."""
