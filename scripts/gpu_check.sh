#!/usr/bin/env bash
# The GPU check, in one command (about 8 minutes on one modern GPU):
#   1. builds TensorRT engines for a tiny model (fp32) and SmolLM2-135M with its 6-layer draft (fp16),
#   2. runs the exactness tests on TrtBackend and on onnxruntime CUDA (pytest -m gpu, tests/engines),
#   3. runs the benchmark (greedy vs jacobi vs lookahead vs speculative; TensorRT, onnxruntime CUDA,
#      and onnxruntime CPU for comparison) and prints its table last.
#
# Needs: an NVIDIA GPU and driver; pip install ".[tensorrt,gpu,dev]" from the checkout (tensorrt and polygraphy,
# onnxruntime-gpu instead of onnxruntime); the test artifacts (`python tests/make_artifacts.py DIR
# --smollm2`, then JACOBI_RT_TEST_ARTIFACTS=DIR; default build/test-artifacts). Engines are built into
# JACOBI_RT_ENGINE_DIR (default build/gpu-check) and reused while they match this GPU and TensorRT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
export JACOBI_RT_TEST_ARTIFACTS="${JACOBI_RT_TEST_ARTIFACTS:-$PWD/build/test-artifacts}"
export JACOBI_RT_ENGINE_DIR="${JACOBI_RT_ENGINE_DIR:-$PWD/build/gpu-check}"
export PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }

echo "== environment"
"$PYTHON" - <<'PY'
import sys
sys.path.insert(0, "tests/engines")
from gpu_helpers import ort_cuda_missing, tensorrt_missing
from jacobi_rt.runtime.backends.cuda import gpu_facts

missing = [m for m in (tensorrt_missing(), ort_cuda_missing()) if m]
if missing:
    sys.exit("gpu_check: " + "; ".join(dict.fromkeys(missing)) + ' (pip install ".[tensorrt,gpu,dev]" from the jacobi-rt checkout, on a machine with an NVIDIA GPU)')
import onnxruntime, tensorrt
gpu = gpu_facts()
print(f"{gpu.name} (compute {gpu.compute_capability}), TensorRT {tensorrt.__version__}, onnxruntime {onnxruntime.__version__}")
PY

echo "== engines and exactness: TensorRT and onnxruntime CUDA"
timeout "$(left)" "$PYTHON" -m pytest tests/engines -m gpu -q -ra -p no:cacheprovider

echo "== benchmark"
timeout "$(left)" "$PYTHON" tests/engines/gpu_bench.py --artifacts "$JACOBI_RT_TEST_ARTIFACTS" --engines "$JACOBI_RT_ENGINE_DIR"
