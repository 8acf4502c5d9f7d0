"""The `invariant` policy on the torch backend: every reduction in a fixed order, so a row's
result never depends on what it is batched with (see torch_twins for the measurements).

Matmuls of bf16/fp16 activations run FBGEMM's fp16 GEMM (the one native uses, on the same
weight copies) with the rows padded so that each goes through the same micro-kernel whatever M
is; fp32 activations, weights that are not exact in fp16, and machines where that padding is not
proven row-invariant run the fp32 MKL GEMM on rows padded to ROW_BLOCK instead."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flakecheck.kernels.ops import AttentionBatch, Ops, fp32_copy
from flakecheck.kernels.torch_twins import (
    fbgemm_fixed_order_linear,
    finish_linear,
    fixed_order_matmul,
    fixed_split_attention,
)

KV_SPLIT_SIZE = 256  # keys a split, whatever the batch; the last split is masked past the row


class InvariantTorchOps(Ops):
    policy = "invariant"
    backend = "torch"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = fbgemm_fixed_order_linear(x, weight, bias)
        if out is not None:
            return out
        return finish_linear(fixed_order_matmul(x.float(), fp32_copy(weight)), bias, x.dtype)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # ATen's fused RMSNorm reduces each fp32 row in one thread in a length-determined order
        # (measured row-invariant, see torch_twins); one fused op instead of seven small ones,
        # which a batch-1 decode step pays 61 times. Hugging Face semantics, as in native.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
        return weight * normed.to(x.dtype)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        # ATen's CPU log-softmax gives one thread a whole row in a length-determined order
        # (measured row-invariant for 1..512 rows of 49152); it is the fixed-order kernel here.
        return torch.log_softmax(logits.float(), dim=-1)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                  scale: float) -> torch.Tensor:
        return fixed_split_attention(q, k_cache, v_cache, batch, scale, KV_SPLIT_SIZE)
