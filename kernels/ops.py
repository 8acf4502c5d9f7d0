"""The one interface every reduction of the model goes through.

The engine never calls a matmul, a softmax or a norm directly: it calls an `Ops`. A kernel
policy (native, splitk, invariant) is a subclass, so a policy changes every reduction of a run
at once without touching the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionBatch:
    """Where each sequence's query rows sit in the packed [T, ...] batch, and what they attend to.

    Sequence i owns packed rows `query_starts[i]:query_starts[i+1]`, whose positions are
    `context_lens[i] - n_new .. context_lens[i] - 1`; its keys live in KV-cache slot `slots[i]`
    rows `0:context_lens[i]`, already written when attention runs.
    """

    slots: list[int]
    query_starts: list[int]
    context_lens: list[int]
    slots_t: torch.Tensor = field(repr=False)
    context_lens_t: torch.Tensor = field(repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def is_decode(self) -> bool:
        """Every sequence contributes exactly one query row (a pure decode step)."""
        return self.query_starts[-1] == len(self.slots)

    def query_len(self, i: int) -> int:
        return self.query_starts[i + 1] - self.query_starts[i]


class Ops:
    """Reductions of a transformer forward pass. This base class is the `native` policy:
    the framework's own kernels (MKL/oneDNN on CPU, cuBLAS and SDPA on CUDA)."""

    policy = "native"
    backend = "torch"

    def __init__(self, profile: str | None = None) -> None:
        self.profile = profile

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] @ weight[N, K].T (+ bias) in the activation dtype, fp32 accumulation."""
        return F.linear(x, weight, bias)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm as Hugging Face computes it: statistics in fp32, scale in the model dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 log-softmax over the last dimension (the vocabulary)."""
        return torch.log_softmax(logits.float(), dim=-1)

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of packed queries q [T, H, D] over the cache [slots, L, KVH, D]."""
        if batch.is_decode:
            return _decode_sdpa(q, k_cache, v_cache, batch, scale)
        out = torch.empty_like(q)
        for i, slot in enumerate(batch.slots):
            lo, hi = batch.query_starts[i], batch.query_starts[i + 1]
            ctx = batch.context_lens[i]
            k = k_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
            v = v_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
            qi = q[lo:hi].transpose(0, 1).unsqueeze(0)
            n = hi - lo
            if n == 1:
                mask = None
            elif n == ctx:
                mask = None
            else:
                mask = causal_mask(n, ctx, q.device)
            o = F.scaled_dot_product_attention(
                qi, k, v, attn_mask=mask, is_causal=(n == ctx and n > 1), scale=scale, enable_gqa=True
            )
            out[lo:hi] = o.squeeze(0).transpose(0, 1)
        return out


def causal_mask(n_query: int, n_ctx: int, device: torch.device) -> torch.Tensor:
    """Boolean [n_query, n_ctx] mask: the last n_query of n_ctx positions, each seeing itself and before."""
    q_pos = torch.arange(n_ctx - n_query, n_ctx, device=device)[:, None]
    return torch.arange(n_ctx, device=device)[None, :] <= q_pos


def _decode_sdpa(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    """One query per sequence: gather the slots, mask each row past its own length, one SDPA call."""
    if batch.num_seqs == 1:
        ctx = batch.context_lens[0]
        k = k_cache[batch.slots[0], :ctx].transpose(0, 1).unsqueeze(0)
        v = v_cache[batch.slots[0], :ctx].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale, enable_gqa=True)
        return o.squeeze(2)
    longest = max(batch.context_lens)
    k = k_cache[batch.slots_t, :longest].transpose(1, 2)
    v = v_cache[batch.slots_t, :longest].transpose(1, 2)
    mask = torch.arange(longest, device=q.device)[None, :] < batch.context_lens_t[:, None]
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
    )
    return o.squeeze(2)
