#!/usr/bin/env bash
# Set up from scratch and run every test, as CI does:
#  1. the export environment (torch, transformers, onnx, onnxruntime) exports the test artifacts
#     and runs the exporter, tools and docs tests (the real SmolLM2-135M export included), plus
#     the few runtime/server tests that need it (greedy vs transformers' generate; Ray Serve);
#  2. a second, torch-free environment (`pip install ".[cpu,serve,structured]"` only) runs the runtime,
#     engine and server tests against those artifacts, proving they need no PyTorch. They run
#     there only, not twice: a plain `pytest` in the export environment still runs everything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
bash scripts/setup.sh
# qemu-user emulates an AVX2-only x86-64 CPU for tests/runtime/test_exact_rows.py, so that the
# one-row kernel that CPU takes is checked whatever CPU runs the tests (the test says so if it is missing).
if ! command -v qemu-x86_64 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null) || echo "could not install qemu-user"
fi
artifacts="$here/build/test-artifacts"
export JACOBI_RT_TEST_ARTIFACTS="$artifacts"

echo "== exporting test artifacts to $artifacts"
"$JACOBI_RT_VENV/bin/python" tests/make_artifacts.py "$artifacts" --smollm2

echo "== exporter, tools and docs suites (export environment)"
"$JACOBI_RT_VENV/bin/python" -m pytest -q -ra tests/exporter tests/tools tests/test_*.py \
    tests/runtime/test_vs_transformers.py tests/server/test_ray.py "$@"

echo "== runtime suite (torch-free environment)"
lean="$here/.venv-runtime"
python3 -m venv "$lean"
"$lean/bin/python" -m pip install -q --upgrade pip
"$lean/bin/python" -m pip install -q "$here[cpu,serve,structured]" pytest httpx openai jsonschema
JACOBI_RT_TORCH_FREE=1 "$lean/bin/python" -m pytest -q -ra tests/runtime tests/engines tests/server "$@"
