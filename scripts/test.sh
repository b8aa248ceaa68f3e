#!/usr/bin/env bash
# Set up from scratch and run every test, as CI does:
#  1. the export environment (torch, transformers, onnx, onnxruntime) runs the whole suite,
#     the real SmolLM2-135M export included, and exports the test artifacts;
#  2. a second, torch-free environment (`pip install ".[cpu,serve]"` only) runs the runtime,
#     engine and server tests against those artifacts, proving they need no PyTorch.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
bash scripts/setup.sh
artifacts="$here/build/test-artifacts"
export JACOBI_RT_TEST_ARTIFACTS="$artifacts"

echo "== exporting test artifacts to $artifacts"
"$JACOBI_RT_VENV/bin/python" tests/make_artifacts.py "$artifacts" --smollm2

echo "== full suite (export environment)"
"$JACOBI_RT_VENV/bin/python" -m pytest -q -ra "$@"

echo "== runtime suite (torch-free environment)"
lean="$here/.venv-runtime"
python3 -m venv "$lean"
"$lean/bin/python" -m pip install -q --upgrade pip
"$lean/bin/python" -m pip install -q "$here[cpu,serve]" pytest httpx openai
JACOBI_RT_TORCH_FREE=1 "$lean/bin/python" -m pytest -q -ra tests/runtime tests/engines tests/server "$@"
