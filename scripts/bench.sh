#!/usr/bin/env bash
# One-command benchmark: set up, export what is missing, build the peers' models once, then run
# `jacobi-rt bench` with the README's configuration (about 5 minutes on an idle 2-core CPU once the models exist).
# Usage: bash scripts/bench.sh [extra jacobi-rt bench options]; JACOBI_RT_VENV=... reuses a venv
# (SKIP_SETUP=1 skips scripts/setup.sh when that venv is ready).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
py="$JACOBI_RT_VENV/bin/python"
jrt="$JACOBI_RT_VENV/bin/jacobi-rt"
# the bench's own extras: plots, the onnxruntime-genai peer (it needs onnxruntime>=1.31, the [cpu] one), OpenVINO GenAI
"$py" -m pip install -q "$here[cpu,bench]"
# llama.cpp as a peer: an sdist that compiles (about 6 minutes on 2 cores). Its native build crashes on
# prompts where the CPU has AMX (docs/bench/2026-12-04-scale-gguf-8b.md), so there it is built with AMX off.
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null && [ -z "${CMAKE_ARGS:-}" ]; then
  export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
"$py" -c "import llama_cpp" 2>/dev/null || CMAKE_BUILD_PARALLEL_LEVEL=2 "$py" -m pip install -q "$here[cpu,llamacpp]"
[ -f build/smollm2-135m/jacobi.json ] || "$jrt" export smollm2-135m --out build/smollm2-135m
[ -f build/smollm2-135m-int8/jacobi.json ] \
  || "$jrt" export smollm2-135m --role draft --quantize int8 --out build/smollm2-135m-int8
[ -f build/smollm2-135m-gguf/jacobi.json ] \
  || "$jrt" export smollm2-135m --weights gguf --out build/smollm2-135m-gguf
[ -f build/smollm2-135m-int4/jacobi.json ] \
  || "$jrt" export smollm2-135m --quantize int4 --graphs-from build/smollm2-135m --out build/smollm2-135m-int4
[ -f build/ortgenai-int4/genai_config.json ] && [ -f build/ortgenai-fp32/genai_config.json ] \
  || "$py" -m jacobi_rt.tools.peers prepare --out build
time "$jrt" bench build/smollm2-135m --draft build/smollm2-135m-int8 \
  --also build/smollm2-135m-gguf --also build/smollm2-135m-int4 \
  --strategies greedy,jacobi,lookahead,speculative,auto \
  --peers ortgenai,ortgenai-ngram,ortgenai-int4,ortgenai-int4-ngram,llamacpp,llamacpp-lookup,openvino,openvino-lookup \
  --limit "${LIMIT:-12}" --max-new-tokens "${NEW_TOKENS:-128}" --repeats 1 --threads 2 \
  --out docs/bench "$@"
