"""The `splitk` policy on the torch backend: the reduction orders of a production GPU engine,
whose split counts follow the batch shape through the device profile's heuristics."""

from __future__ import annotations

import torch
from flakecheck.kernels.ops import AttentionBatch, Ops, fp32_copy
from flakecheck.kernels.profiles import (
    attention_splits,
    get_profile,
    kv_chunk_size,
    matmul_splits,
    split_bounds,
)
from flakecheck.kernels.torch_twins import (
    chunked_attention,
    finish_linear,
    rmsnorm_from_sumsq,
    split_k_matmul,
    split_row_log_softmax,
    split_row_sum,
)

MAX_ROW_SPLITS = 4


def row_splits(rows: int, sms: int) -> int:
    """Split-reduction for norms: with too few rows to fill the SMs, each row is reduced by up to
    4 programs (8 rows' worth of programs per SM is considered full)."""
    return max(1, min(MAX_ROW_SPLITS, sms // (8 * max(rows, 1))))


class SplitKTorchOps(Ops):
    policy = "splitk"
    backend = "torch"

    def __init__(self, profile: str | None = None) -> None:
        super().__init__(profile)
        self.sms = get_profile(profile).sms

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        m, k = x.shape
        splits = matmul_splits(m, weight.shape[0], k, self.sms)
        acc = split_k_matmul(x.float(), fp32_copy(weight), split_bounds(k, splits))
        return finish_linear(acc, bias, x.dtype)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        rows = x32.numel() // x32.shape[-1]
        sumsq = split_row_sum(x32 * x32, row_splits(rows, self.sms))
        return rmsnorm_from_sumsq(x32, sumsq, weight, eps, x.dtype)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        rows = logits.numel() // logits.shape[-1]
        return split_row_log_softmax(logits.float(), row_splits(rows, self.sms))

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                  scale: float) -> torch.Tensor:
        longest_query = max(batch.query_len(i) for i in range(batch.num_seqs))
        longest = max(batch.context_lens)
        splits = attention_splits(batch.num_seqs, k_cache.shape[2], longest_query, longest, self.sms)
        return chunked_attention(q, k_cache, v_cache, batch, scale, kv_chunk_size(longest, splits), 1)
