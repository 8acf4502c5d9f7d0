from __future__ import annotations

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.rmsnorm import RMSNorm
from flakecheck.engine.layers.rotary import RotaryEmbedding
from flakecheck.engine.model_config import HEAD
from flakecheck.kernels import Ops


class Attention:
    """GQA self-attention: fused qkv projection, optional q/k RMSNorm (per head: Qwen3, Gemma 3; over the whole
    projection: OLMo 2), RoPE, KV written to the cache before the policy's attention kernel reads it — over the
    layer's sliding `window` when it has one, its scores soft-capped where the family caps them."""

    def __init__(self, ops: Ops, layer: int, qkv: Linear, o_proj: Linear, num_heads: int, num_kv_heads: int,
                 head_dim: int, q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None,
                 qk_norm: str = HEAD, window: int | None = None, scale: float | None = None,
                 softcap: float | None = None) -> None:
        self.ops, self.layer, self.qkv, self.o_proj = ops, layer, qkv, o_proj
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_norm, self.k_norm, self.qk_norm = q_norm, k_norm, qk_norm
        self.window, self.softcap = window, softcap
        self.scale = head_dim**-0.5 if scale is None else scale
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
            q, k = self._normed(qkv, tokens, layout)
            q, k = RotaryEmbedding.apply(q, rope), RotaryEmbedding.apply(k, rope)
        cache.write(self.layer, batch.cache_rows, k, v)
        if batch.fanout is not None:
            src, dst = batch.fanout
            cache.write(self.layer, dst, k.index_select(0, src), v.index_select(0, src))
        out = self.ops.attention(q, cache.k[self.layer], cache.v[self.layer], batch.attention[self.window],
                                 self.scale, self.softcap)
        return self.o_proj(out.reshape(tokens, q_width), layout)

    def _normed(self, qkv: torch.Tensor, tokens: int, layout) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
        assert self.q_norm is not None and self.k_norm is not None
        q_width, kv_width = self.q_width, self.kv_width
        q, k = qkv[:, :q_width], qkv[:, q_width : q_width + kv_width]
        if self.qk_norm == HEAD:
            q_groups = layout.norm(self.num_heads) if layout is not None else None
            k_groups = layout.norm(self.num_kv_heads) if layout is not None else None
            q = self.q_norm(q.reshape(tokens, self.num_heads, self.head_dim), q_groups)
            k = self.k_norm(k.reshape(tokens, self.num_kv_heads, self.head_dim), k_groups)
            return q, k
        groups = layout.norm(1) if layout is not None else None  # one row a token: the whole projection
        q = self.q_norm(q.contiguous(), groups).view(tokens, self.num_heads, self.head_dim)
        k = self.k_norm(k.contiguous(), groups).view(tokens, self.num_kv_heads, self.head_dim)
        return q, k
