#!/usr/bin/env bash
# The main job on a fresh machine: set up, export the embedded SmolLM2-135M-Instruct and an int8
# draft of it (reusing the first export's checked graphs), then run greedy, Jacobi, lookahead,
# speculative and auto decoding side by side on the same prompts, check every output is
# token-identical to greedy, and print the speed ratios.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
py="$JACOBI_RT_VENV/bin/python"
jrt="$JACOBI_RT_VENV/bin/jacobi-rt"
[ -f build/smollm2-135m/jacobi.json ] || "$jrt" export smollm2-135m --out build/smollm2-135m
[ -f build/smollm2-135m-int8/jacobi.json ] \
  || "$jrt" export smollm2-135m --role draft --quantize int8 --graphs-from build/smollm2-135m --out build/smollm2-135m-int8
"$py" -m benchmarks.demo build/smollm2-135m --draft build/smollm2-135m-int8 "$@"
