from __future__ import annotations

from typing import Any

import torch


class RotaryEmbedding:
    """RoPE tables from transformers' own rotary module (theta, scaling and attention factor included)."""

    def __init__(self, hf_config: Any, max_len: int, dtype: torch.dtype) -> None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        rope = LlamaRotaryEmbedding(hf_config)
        positions = torch.arange(max_len)[None, :]
        cos, sin = rope(torch.empty(0, dtype=torch.float32), positions)
        # Hugging Face casts the fp32 tables to the activation dtype before rotating; so do we.
        self.cos, self.sin = cos[0].to(dtype), sin[0].to(dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, D] at its token positions [T]."""
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
