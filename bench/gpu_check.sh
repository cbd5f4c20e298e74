#!/usr/bin/env bash
# GPU check of the Triton kernels (correctness vs the NumPy reference, then achieved bandwidth vs
# the HBM peak). One prepared command, budgeted at < 8 minutes on an H200:
#   bash bench/gpu_check.sh [--peak-gbps 4800] [--shape llama8b|smollm2] [--skip-bench]
# Needs torch built with CUDA, triton and numpy. Without a GPU it exits 2 and measures nothing.
# Status: written, NOT yet run on a GPU (see docs/tensorrt.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device visible to torch (or torch missing / CPU-only build); nothing measured." >&2
  exit 2
fi
exec timeout 480 python bench/gpu_check.py "$@"
