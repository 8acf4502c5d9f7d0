#!/usr/bin/env bash
# The GPU check, one command: kernel tests natively, `kernels check`, 24 demo cases under each policy, the
# engine against `generate`, the fixed-order Triton matmul against cuBLAS, an 8B-shaped model; at most 10
# minutes; one JSON summary and a table (see docs/gpu.md). Usage: scripts/gpu_check.sh [python] [options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
shift || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" scripts/gpu_check.py "$@"
