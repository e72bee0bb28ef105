#!/usr/bin/env bash
# Every GPU check in one go, for a Linux machine with an NVIDIA GPU (CPU-only CI cannot run
# them). Each step prints what it saw and its figures; a step that cannot run says why and
# the script goes on, so one run answers every question. Steps:
#  1. NVML: the node's GPU readings (what NodeResources.gpus gossips) and the driver's CUDA.
#  2. The compiler-free GPU path: `skulk engines install --wheel` (xllamacpp's CUDA wheel for
#     the driver's CUDA into the engines dir), the bundled skulk-llama-server reporting cuda,
#     and a fresh node advertising llama_server-cuda, placing the tiny GGUF with its layers
#     on the GPU (VRAM admission), serving 8 streams at once.
#  3. `skulk engines install --backend cuda`: the native CUDA llama-server (needs nvcc); the
#     served-engine tests then run against it (8 concurrent streams etc.).
#  4. bench/concurrency.py on the GPU build: Skulk's engine against llama-server run
#     directly, C=1/4/8 (ratios printed).
#  5. vLLM, when SKULK_VLLM_BIN (the `vllm` of its own venv) and SKULK_VLLM_TEST_MODEL (a
#     small HF model directory) are set: the vllm engine's GPU test.
# Usage: bench/gpu/check.sh [--dry-run]  (from the repository root). --dry-run prints the
# steps' commands without running them (what the CPU-side test checks).
# Offline GPU machines: steps 2 and 3 need the package registries (the wheel index, the
# llama.cpp sdist); without them they report the failure and the later steps skip.
set -uo pipefail
cd "$(dirname "$0")/../.."

DRY=""
[ "${1:-}" = "--dry-run" ] && DRY=echo
RESULTS=()
step() {  # step NAME COMMAND...: run it, record pass/fail, never stop the script
  local name="$1"; shift
  echo "=== $name: $*"
  local start; start=$(date +%s)
  if $DRY "$@"; then RESULTS+=("PASS $name ($(( $(date +%s) - start ))s)")
  else RESULTS+=("FAIL $name ($(( $(date +%s) - start ))s)"); fi
}

export SKULK_ENGINES_DIR="${SKULK_ENGINES_DIR:-$(mktemp -d)}"
step nvml uv run python -c 'from skulk.facts.nvml import collect_gpus, driver_cuda_version as v; g = collect_gpus(); print(g, "driver CUDA", v()); assert g, "NVML sees no GPU"'

step gpu-wheel uv run skulk engines install --backend cuda --wheel
step gpu-wheel-list uv run skulk engines list
step bundled-on-gpu env SKULK_GPU_CHECK_ENGINES_DIR="$SKULK_ENGINES_DIR" \
  uv run pytest -q -x -rs tests/e2e/test_llama_server_serving.py -k fresh_node_serves_four

step native-cuda-build nice uv run skulk engines install --backend cuda
SERVER="$(ls "$SKULK_ENGINES_DIR"/llama.cpp-*-cuda/bin/llama-server 2>/dev/null | head -1)"
if [ -n "$SERVER" ] || [ -n "$DRY" ]; then
  step native-cuda-version "${SERVER:-llama-server}" --version
  step served-tests env SKULK_LLAMA_SERVER_BIN="${SERVER:-llama-server}" \
    uv run pytest -q -x -rs tests/worker/engines/served tests/worker/runner/test_served_runner.py tests/e2e/test_llama_server_serving.py
  step concurrency env SKULK_LLAMA_SERVER_BIN="${SERVER:-llama-server}" \
    uv run python bench/concurrency.py --bench-model --rounds 2 --no-inproc
else
  RESULTS+=("SKIP native-cuda: no CUDA llama-server was built")
fi

if [ -n "${SKULK_VLLM_BIN:-}" ] && [ -n "${SKULK_VLLM_TEST_MODEL:-}" ]; then
  step vllm uv run pytest -q -x -rs tests/worker/engines/served/test_vllm.py
else
  RESULTS+=("SKIP vllm: set SKULK_VLLM_BIN and SKULK_VLLM_TEST_MODEL")
fi

echo "=== summary"
printf '%s\n' "${RESULTS[@]}"
! printf '%s\n' "${RESULTS[@]}" | grep -q '^FAIL'
