#!/usr/bin/env bash
# Set up from scratch and run every test, as CI does:
#  1. the export environment (torch, transformers, onnx, onnxruntime) exports the test artifacts
#     and runs the exporter, tools, benchmarks and docs tests (the real SmolLM2-135M export included), plus
#     the few runtime/server tests that need it (greedy vs transformers' generate; Ray Serve);
#  2. a second, torch-free environment (`pip install ".[cpu,serve,structured]"` only) runs the runtime,
#     engine and server tests against those artifacts, proving they need no PyTorch. They run
#     there only, not twice: a plain `pytest` in the export environment still runs everything.
#  3. ruff's lint and format check over the whole tree (pyproject.toml's [tool.ruff]).
#  The suites run one after the other, each in two workers (a test file each at a time, so that its module
#  fixtures stay in one worker): side by side, three processes on two cores took as long as the two in turn
#  (docs/bench/2026-12-07-ci-time.md); in turn each has both cores and its report comes in order. Each worker
#  has one core of its own (tests/conftest.py): two-thread pools in both took turns (docs/bench/2026-12-07-ci-cores.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
export JACOBI_RT_VENV="${JACOBI_RT_VENV:-$here/.venv}"
bash scripts/setup.sh
mkdir -p "$here/build"
# qemu-user emulates an AVX2-only x86-64 CPU for tests/runtime/test_exact_rows.py, so that the
# one-row kernel that CPU takes is checked whatever CPU runs the tests (the test says so if it is missing).
# It installs in the background while the artifacts export (apt waits on the network); the runtime suite waits for it.
qemu_setup=""
if ! command -v qemu-x86_64 >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    ( (apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null) || echo "could not install qemu-user" ) \
        >"$here/build/qemu-install.log" 2>&1 &
    qemu_setup=$!
fi
# ruff (pinned in the dev extra): lint and format, configured in pyproject.toml; a finding fails the run
# at the end, after the tests, so that one run reports both.
echo "== ruff: lint and format check"
lint_status=0
"$JACOBI_RT_VENV/bin/ruff" check . && "$JACOBI_RT_VENV/bin/ruff" format --check . || lint_status=$?
artifacts="$here/build/test-artifacts"
export JACOBI_RT_TEST_ARTIFACTS="$artifacts"

lean="$here/.venv-runtime"
lean_log="$here/build/runtime-env-setup.log"
# The torch-free environment installs while the artifacts export (pip waits on the network, the exports
# on the CPU); not during setup.sh, whose build of the project would race this one in build/.
echo "== torch-free environment: installing in the background (log: $lean_log)"
( python3 -m venv "$lean" \
  && "$lean/bin/python" -m pip install -q --upgrade pip \
  && "$lean/bin/python" -m pip install -q "$here[cpu,serve,structured]" pytest pytest-xdist httpx openai jsonschema ) >"$lean_log" 2>&1 &
lean_setup=$!

echo "== exporting test artifacts to $artifacts (two at a time)"
"$JACOBI_RT_VENV/bin/python" tests/make_artifacts.py "$artifacts" --smollm2 --jobs 2
wait "$lean_setup" || { cat "$lean_log"; echo "the torch-free environment did not install (log above)"; exit 1; }
if [ -n "$qemu_setup" ]; then
    wait "$qemu_setup" || true
    cat "$here/build/qemu-install.log"
fi

suite_options=(-q -ra --durations=25 -n 2 --dist loadfile)  # both suites: two workers, a test file each at a time
echo "== exporter, tools and docs suites (export environment, two workers)"
status=0
"$JACOBI_RT_VENV/bin/python" -m pytest "${suite_options[@]}" tests/exporter tests/tools tests/benchmarks tests/test_*.py \
    tests/runtime/test_vs_transformers.py tests/server/test_ray.py "$@" || status=$?

echo "== runtime, engine and server suites (torch-free environment, two workers)"
runtime_status=0
JACOBI_RT_TORCH_FREE=1 "$lean/bin/python" -m pytest "${suite_options[@]}" tests/runtime tests/engines tests/server "$@" \
    || runtime_status=$?
echo "== exporter suites: exit $status; runtime suite: exit $runtime_status; ruff: exit $lint_status"
[ "$status" = 0 ] && [ "$runtime_status" = 0 ] && [ "$lint_status" = 0 ]
