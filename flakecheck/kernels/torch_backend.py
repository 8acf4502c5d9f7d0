"""The torch backend: every order of a plan on the CPU (the twins of the Triton kernels' orders), each on
the implementation the machine's self-check chose (flakecheck/kernels/paths.py).

Fast paths: FIXED matmuls run FBGEMM's fp16 GEMM with rows padded off its 1- and 2-row micro-kernels
(fp32 MKL on rows padded to 8 where the weight does not pack exactly); split-K matmuls run the K ranges'
partial GEMMs in one batched call on rows padded to 8; FIXED norms and log-softmax run ATen's fused row
kernels; split ones reduce each row in S contiguous parts added in order; attention reduces each sequence
in KV splits of its plan's size over whole 64-key blocks. Every primitive gives a row the same bits
whatever else the call holds (tests/test_kernels_rows.py) — on a machine where the self-check verified it;
elsewhere the fallbacks of flakecheck/kernels/fallbacks.py run instead.
"""

from __future__ import annotations

import torch

from flakecheck.kernels import faults
from flakecheck.kernels.fallbacks import lanes_log_softmax, lanes_split_sum, rowwise_matmul, split_matmul, tiled_matmul
from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.native import (
    NativeAttentionMeta,
    native_attention,
    native_linear,
    native_log_softmax,
    native_rmsnorm,
)
from flakecheck.kernels.paths import FAST, KernelPaths
from flakecheck.kernels.plan import BLOCKED, FIXED, NATIVE
from flakecheck.kernels.profiles import split_bounds
from flakecheck.kernels.tensor_parallel import TP_INVARIANT, blocked_log_softmax
from flakecheck.kernels.torch_twins import (
    SplitAttentionMeta,
    fbgemm_fixed_order_linear,
    finish_linear,
    fixed_order_matmul,
    rmsnorm_from_sumsq,
    short_sum,
    split_attention,
    split_k_matmul,
    split_row_log_softmax,
    split_row_sum,
)
from flakecheck.kernels.weights import LinearWeights

AttentionMeta = NativeAttentionMeta | SplitAttentionMeta


class TorchBackend:
    name = "torch"

    def __init__(self, fast_cpu_matmuls: bool = True, paths: KernelPaths = FAST) -> None:
        self.paths = paths
        self.fast_cpu_matmuls = fast_cpu_matmuls and paths.native_matmul == "fbgemm"
        self.faults = faults.active()  # tests only (flakecheck/kernels/faults.py)

    def _fault(self, primitive: str, path: str, out: torch.Tensor, rows: int) -> torch.Tensor:
        return faults.perturb(out, rows) if (primitive, path) in self.faults else out

    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None, orders: set[str]) -> LinearWeights:
        """The copies the given matmul orders read (`splitk`, `tp-invariant`: fp32; `invariant`: the fp16 pack
        where FBGEMM serves it, else fp32; `native`: the fp16 pack)."""
        fbgemm = self.paths.fbgemm == "padded"
        fp32 = bool({"splitk", TP_INVARIANT} & orders) or ("invariant" in orders and not fbgemm)
        fp16 = "native" in orders or ("invariant" in orders and fbgemm)
        return LinearWeights.prepare(weight, bias, fp32=fp32, fp16=fp16)

    def linear(self, x: torch.Tensor, w: LinearWeights, order: int) -> torch.Tensor:
        if order == NATIVE:
            return native_linear(x, w, self.fast_cpu_matmuls)
        if order == FIXED:
            if w.pack is not None and self.paths.fbgemm == "padded" and x.dtype != torch.float32 \
                    and x.device.type == "cpu":
                out = fbgemm_fixed_order_linear(x, w.pack)
                return self._fault("fbgemm", "padded", out, x.shape[0]) if self.faults else out
            acc = self._fixed_matmul(x.float(), _fp32(w))
            if self.faults:
                acc = self._fault("fixed_matmul", self.paths.fixed_matmul, acc, x.shape[0])
            return finish_linear(acc, w.bias, x.dtype)
        bounds = split_bounds(x.shape[1], order)
        path = self.paths.split_matmul
        if path == "batched":
            acc = split_k_matmul(x.float(), _fp32(w), bounds)
        else:
            acc = split_matmul(x.float(), _fp32(w), bounds, rowwise=path == "rowwise")
        if self.faults:
            acc = self._fault("split_matmul", path, acc, x.shape[0])
        return finish_linear(acc, w.bias, x.dtype)

    def _fixed_matmul(self, x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
        path = self.paths.fixed_matmul
        if path == "padded":
            return fixed_order_matmul(x32, w32)
        return tiled_matmul(x32, w32) if path == "tiled" else rowwise_matmul(x32, w32)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, order: int) -> torch.Tensor:
        order = FIXED if order == BLOCKED else order  # the final norm of the tp-invariant order: no rank splits it
        lanes = self.paths.norm == "lanes"
        if order in (NATIVE, FIXED) and not (lanes and order == FIXED):
            # ATen's fused RMSNorm reduces each fp32 row in one thread in a length-determined order
            # (measured row-invariant, see torch_twins): the fixed-order kernel and native's at once
            out = native_rmsnorm(x, weight, eps)
        else:
            x32 = x.float()
            splits = 1 if order == FIXED else order
            sumsq = lanes_split_sum(x32 * x32, splits) if lanes else split_row_sum(x32 * x32, splits)
            out = rmsnorm_from_sumsq(x32, sumsq, weight, eps, x.dtype)
        return self._fault("norm", self.paths.norm, out, x.shape[0]) if self.faults else out

    def log_softmax(self, logits: torch.Tensor, order: int) -> torch.Tensor:
        if order == BLOCKED:
            out = blocked_log_softmax(logits, short_sum)
            return self._fault("softmax", self.paths.softmax, out, logits.shape[0]) if self.faults else out
        lanes = self.paths.softmax == "lanes"
        if order in (NATIVE, FIXED) and not (lanes and order == FIXED):
            # one thread a whole row in a length-determined order (measured row-invariant for 1..512
            # rows of 49152): the fixed-order kernel here
            out = native_log_softmax(logits)
        else:
            splits = 1 if order == FIXED else order
            out = lanes_log_softmax(logits.float(), splits) if lanes else split_row_log_softmax(logits.float(), splits)
        return self._fault("softmax", self.paths.softmax, out, logits.shape[0]) if self.faults else out

    def attention_meta(self, layout: AttentionLayout, group: int, device: torch.device) -> AttentionMeta:
        assert layout.kv_splits is not None, "a plan assigns every sequence its KV split first"
        if all(s == NATIVE for s in layout.kv_splits):
            return NativeAttentionMeta.build(layout, device)
        if any(s == NATIVE for s in layout.kv_splits):
            raise ValueError("native attention cannot share a forward pass with planned splits")
        return SplitAttentionMeta.build(layout, group, tiled=self.paths.attention == "tiled")

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta,
                  scale: float, softcap: float | None = None) -> torch.Tensor:
        if isinstance(meta, NativeAttentionMeta):
            return native_attention(q, k_cache, v_cache, meta, scale, softcap)
        out = split_attention(q, k_cache, v_cache, meta, scale, softcap)
        return self._fault("attention", self.paths.attention, out, q.shape[0]) if self.faults else out


def _fp32(w: LinearWeights) -> torch.Tensor:
    if w.w32 is None:
        raise ValueError("this weight was prepared without an fp32 copy (prepare it for the orders it runs)")
    return w.w32
