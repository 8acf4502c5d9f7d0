"""The two policies on the Triton kernels (a CUDA device, or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import math

import torch
from flakecheck.kernels import triton_kernels as tk
from flakecheck.kernels.invariant import KV_SPLIT_SIZE
from flakecheck.kernels.ops import AttentionBatch, Ops
from flakecheck.kernels.profiles import attention_splits, get_profile, kv_chunk_size, matmul_splits


def _row_geometry(batch: AttentionBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each packed query row's KV slot and how many keys it sees (its position + 1)."""
    slots, limits = [], []
    for i, slot in enumerate(batch.slots):
        n, ctx = batch.query_len(i), batch.context_lens[i]
        slots += [slot] * n
        limits += range(ctx - n + 1, ctx + 1)
    return (torch.tensor(slots, dtype=torch.int32, device=device),
            torch.tensor(limits, dtype=torch.int32, device=device))


def _split_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                     scale: float, split_size: int) -> torch.Tensor:
    row_slots, row_limits = _row_geometry(batch, q.device)
    num_splits = math.ceil(max(batch.context_lens) / split_size)
    m, l_, o = tk.attention_splits(q, k_cache, v_cache, row_slots, row_limits, scale, split_size, num_splits)
    return tk.combine_splits(m, l_, o, q.dtype)


class InvariantTritonOps(Ops):
    policy = "invariant"
    backend = "triton"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return tk.matmul_persistent(x, weight, bias)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return tk.rmsnorm(x, weight, eps)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        return tk.log_softmax(logits)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                  scale: float) -> torch.Tensor:
        return _split_attention(q, k_cache, v_cache, batch, scale, KV_SPLIT_SIZE)


class SplitKTritonOps(InvariantTritonOps):
    """Split-K matmul and split-KV attention by the profile's heuristics; norms stay one row a program."""

    policy = "splitk"

    def __init__(self, profile: str | None = None) -> None:
        super().__init__(profile)
        self.sms = get_profile(profile).sms

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        splits = matmul_splits(x.shape[0], weight.shape[0], x.shape[1], self.sms)
        return tk.matmul_splitk(x, weight, splits, bias)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                  scale: float) -> torch.Tensor:
        longest_query = max(batch.query_len(i) for i in range(batch.num_seqs))
        longest = max(batch.context_lens)
        splits = attention_splits(batch.num_seqs, k_cache.shape[2], longest_query, longest, self.sms)
        return _split_attention(q, k_cache, v_cache, batch, scale, kv_chunk_size(longest, splits))
