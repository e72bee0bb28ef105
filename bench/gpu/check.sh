#!/usr/bin/env bash
# One short check for a Linux machine with an NVIDIA GPU (it cannot run on CPU-only CI):
#  1. NVML: the node's GPU readings (what NodeResources.gpus gossips).
#  2. `skulk engines install --backend cuda`: the CUDA llama-server, built from the pinned
#     llama.cpp; the served-engine tests then run against it (8 concurrent streams etc.).
#  3. vLLM, when SKULK_VLLM_BIN (the `vllm` of its own venv) and SKULK_VLLM_TEST_MODEL (a
#     small HF model directory) are set: the vllm engine's GPU test.
# Usage: bench/gpu/check.sh   (from the repository root; needs nvcc, cmake, a C++ compiler)
set -euo pipefail
cd "$(dirname "$0")/../.."

uv run python -c 'from skulk.facts.nvml import collect_gpus; g = collect_gpus(); print(g); assert g, "NVML sees no GPU"'

export SKULK_ENGINES_DIR="${SKULK_ENGINES_DIR:-$(mktemp -d)}"
time nice uv run skulk engines install --backend cuda
SERVER="$(ls "$SKULK_ENGINES_DIR"/llama.cpp-*-cuda/bin/llama-server)"
"$SERVER" --version
SKULK_LLAMA_SERVER_BIN="$SERVER" uv run pytest -q -x tests/worker/engines/served tests/worker/runner/test_served_runner.py

if [ -n "${SKULK_VLLM_BIN:-}" ] && [ -n "${SKULK_VLLM_TEST_MODEL:-}" ]; then
  uv run pytest -q -x -rs tests/worker/engines/served/test_vllm.py
else
  echo "vLLM check skipped: set SKULK_VLLM_BIN and SKULK_VLLM_TEST_MODEL" >&2
fi
