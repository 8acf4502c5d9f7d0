from __future__ import annotations

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.rmsnorm import RMSNorm
from flakecheck.engine.layers.rotary import RotaryEmbedding
from flakecheck.kernels import Ops


class Attention:
    """GQA self-attention: fused qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE,
    KV written to the cache before the policy's attention kernel reads it."""

    def __init__(self, ops: Ops, layer: int, qkv: Linear, o_proj: Linear, num_heads: int, num_kv_heads: int,
                 head_dim: int, q_norm: RMSNorm | None, k_norm: RMSNorm | None) -> None:
        self.ops, self.layer, self.qkv, self.o_proj = ops, layer, qkv, o_proj
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_norm, self.k_norm = q_norm, k_norm
        self.scale = head_dim**-0.5
        self.q_width, self.kv_width = num_heads * head_dim, num_kv_heads * head_dim

    def __call__(self, x: torch.Tensor, batch: ForwardBatch, cache: KVCache,
                 rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        tokens = x.shape[0]
        layout = batch.layout
        qkv = self.qkv(x, layout)
        q_width, kv_width = self.q_width, self.kv_width
        v = qkv[:, q_width + kv_width :].view(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is None or self.k_norm is None:
            # q and k rotated together: one set of elementwise ops for both
            qk = qkv[:, : q_width + kv_width].view(tokens, self.num_heads + self.num_kv_heads, self.head_dim)
            qk = RotaryEmbedding.apply(qk, rope)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        else:
            q_groups = layout.norm(self.num_heads) if layout is not None else None
            k_groups = layout.norm(self.num_kv_heads) if layout is not None else None
            q = self.q_norm(qkv[:, :q_width].reshape(tokens, self.num_heads, self.head_dim), q_groups)
            k = self.k_norm(qkv[:, q_width : q_width + kv_width].reshape(tokens, self.num_kv_heads, self.head_dim),
                            k_groups)
            q, k = RotaryEmbedding.apply(q, rope), RotaryEmbedding.apply(k, rope)
        cache.write(self.layer, batch.cache_rows, k, v)
        if batch.fanout is not None:
            src, dst = batch.fanout
            cache.write(self.layer, dst, k.index_select(0, src), v.index_select(0, src))
        out = self.ops.attention(q, cache.k[self.layer], cache.v[self.layer], batch.attention, self.scale)
        return self.o_proj(out.reshape(tokens, q_width), layout)
