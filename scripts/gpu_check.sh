#!/usr/bin/env bash
# On a CUDA machine: run the kernel tests natively, then time the fixed-order Triton matmul
# against torch.matmul (cuBLAS) at M in {1,16,64,256,2048} on SmolLM2-135M's projection shapes
# and 4096x4096, bf16. A few minutes of GPU time. Usage: scripts/gpu_check.sh [python]
set -euo pipefail
PY="${1:-.venv/bin/python}"
cd "$(dirname "$0")/.."
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

echo "== kernel tests (native CUDA) =="
"$PY" -m pytest -q -x tests/test_kernels_triton.py tests/test_kernels_twins.py
echo "== flakecheck kernels check --device cuda =="
"$PY" -m flakecheck.cli kernels check --device cuda --dtype bfloat16 || echo "kernels check exit $?"

echo "== fixed-order Triton matmul vs cuBLAS (bf16, median of 20) =="
"$PY" - <<'PYEOF'
import torch
from triton.testing import do_bench
from flakecheck.kernels.triton_kernels import matmul_persistent

shapes = {"qkv 576x960": (576, 960), "o_proj 576x576": (576, 576), "gate_up 576x3072": (576, 3072),
          "down 1536x576": (1536, 576), "lm_head 576x49152": (576, 49152), "square 4096x4096": (4096, 4096)}
print(f"{'shape (KxN)':20s} {'M':>5s} {'triton ms':>10s} {'cublas ms':>10s} {'ratio':>6s} {'triton TFLOP/s':>15s} {'max|diff|':>10s}")
for name, (k, n) in shapes.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    for m in (1, 16, 64, 256, 2048):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_tri = do_bench(lambda: matmul_persistent(x, w), rep=50, return_mode="median")
        t_ref = do_bench(lambda: x @ w.T, rep=50, return_mode="median")
        diff = (matmul_persistent(x, w).float() - (x @ w.T).float()).abs().max().item()
        tflops = 2 * m * n * k / (t_tri * 1e-3) / 1e12
        print(f"{name:20s} {m:5d} {t_tri:10.4f} {t_ref:10.4f} {t_tri / t_ref:6.2f} {tflops:15.1f} {diff:10.2e}")
PYEOF
