"""The torch backend: every order of a plan on the CPU (the twins of the Triton kernels' orders).

FIXED matmuls run FBGEMM's fp16 GEMM with rows padded off its 1- and 2-row micro-kernels (fp32 MKL
on rows padded to 8 where that path is not exact or not proven on this machine); split-K matmuls
run one fp32 GEMM per K range on rows padded to 8; FIXED norms and log-softmax run ATen's fused row
kernels (measured row-invariant); split ones reduce each row in S contiguous parts added in order;
attention reduces each sequence in KV splits of its plan's size over whole 64-key blocks. Every
primitive gives a row the same bits whatever else the call holds (tests/test_kernels_rows.py).
"""

from __future__ import annotations

import torch
from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.native import (
    NativeAttentionMeta,
    native_attention,
    native_linear,
    native_log_softmax,
    native_rmsnorm,
)
from flakecheck.kernels.plan import FIXED, NATIVE
from flakecheck.kernels.profiles import split_bounds
from flakecheck.kernels.torch_twins import (
    SplitAttentionMeta,
    fbgemm_fixed_order_linear,
    fbgemm_rows_invariant,
    finish_linear,
    fixed_order_matmul,
    rmsnorm_from_sumsq,
    split_attention,
    split_k_matmul,
    split_row_log_softmax,
    split_row_sum,
)
from flakecheck.kernels.weights import LinearWeights

AttentionMeta = NativeAttentionMeta | SplitAttentionMeta


class TorchBackend:
    name = "torch"

    def __init__(self, fast_cpu_matmuls: bool = True) -> None:
        self.fast_cpu_matmuls = fast_cpu_matmuls

    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None, orders: set[str]) -> LinearWeights:
        """The copies the given matmul orders read (`splitk`: fp32; `invariant`, `native`: fp16 pack, and
        fp32 where the padded fp16 path is not proven row-invariant on this machine)."""
        fp32 = "splitk" in orders or ("invariant" in orders and not fbgemm_rows_invariant())
        return LinearWeights.prepare(weight, bias, fp32=fp32, fp16=bool(orders & {"invariant", "native"}))

    def linear(self, x: torch.Tensor, w: LinearWeights, order: int) -> torch.Tensor:
        if order == NATIVE:
            return native_linear(x, w, self.fast_cpu_matmuls)
        if order == FIXED:
            if w.pack is not None and x.dtype != torch.float32 and x.device.type == "cpu" \
                    and fbgemm_rows_invariant():
                return fbgemm_fixed_order_linear(x, w.pack)
            return finish_linear(fixed_order_matmul(x.float(), _fp32(w)), w.bias, x.dtype)
        return finish_linear(split_k_matmul(x.float(), _fp32(w), split_bounds(x.shape[1], order)), w.bias, x.dtype)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, order: int) -> torch.Tensor:
        if order in (NATIVE, FIXED):
            # ATen's fused RMSNorm reduces each fp32 row in one thread in a length-determined order
            # (measured row-invariant, see torch_twins): the fixed-order kernel and native's at once
            return native_rmsnorm(x, weight, eps)
        x32 = x.float()
        return rmsnorm_from_sumsq(x32, split_row_sum(x32 * x32, order), weight, eps, x.dtype)

    def log_softmax(self, logits: torch.Tensor, order: int) -> torch.Tensor:
        if order in (NATIVE, FIXED):
            # one thread a whole row in a length-determined order (measured row-invariant for 1..512
            # rows of 49152): the fixed-order kernel here
            return native_log_softmax(logits)
        return split_row_log_softmax(logits.float(), order)

    def attention_meta(self, layout: AttentionLayout, group: int, device: torch.device) -> AttentionMeta:
        assert layout.kv_splits is not None, "a plan assigns every sequence its KV split first"
        if all(s == NATIVE for s in layout.kv_splits):
            return NativeAttentionMeta.build(layout, device)
        if any(s == NATIVE for s in layout.kv_splits):
            raise ValueError("native attention cannot share a forward pass with planned splits")
        return SplitAttentionMeta.build(layout, group)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta,
                  scale: float) -> torch.Tensor:
        if isinstance(meta, NativeAttentionMeta):
            return native_attention(q, k_cache, v_cache, meta, scale)
        return split_attention(q, k_cache, v_cache, meta, scale)


def _fp32(w: LinearWeights) -> torch.Tensor:
    if w.w32 is None:
        raise ValueError("this weight was prepared without an fp32 copy (prepare it for the orders it runs)")
    return w.w32
