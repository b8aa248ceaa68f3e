#!/usr/bin/env bash
# The main job on a fresh machine: set up, export the embedded SmolLM2-135M-Instruct, then run
# greedy and the other strategies side by side on the same prompts and print the speed ratio.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
bash scripts/setup.sh
py="$JACOBI_RT_VENV/bin/python"
jrt="$JACOBI_RT_VENV/bin/jacobi-rt"
[ -f build/smollm2-135m/jacobi.json ] || "$jrt" export smollm2-135m --out build/smollm2-135m
"$py" -m jacobi_rt.tools.demo build/smollm2-135m --strategies "${STRATEGIES:-greedy,jacobi}" "$@"
