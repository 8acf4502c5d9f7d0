from __future__ import annotations

from typing import Any

import torch


class RotaryEmbedding:
    """RoPE tables from transformers' own rotary module (theta, scaling type and attention factor
    from the config's rope_parameters), looked up once a step and applied to q and k of every layer."""

    def __init__(self, hf_config: Any, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # seconds: only with a model

        rope = LlamaRotaryEmbedding(hf_config)
        positions = torch.arange(max_len)[None, :]
        cos, sin = rope(torch.empty(0, dtype=torch.float32), positions)
        # Hugging Face casts the fp32 tables to the activation dtype before rotating; so do we.
        cos, sin = cos[0].to(device=device, dtype=dtype), sin[0].to(device=device, dtype=dtype)
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == flip_halves(x) * [-sin | sin]: negation is exact, so this is the
        # same arithmetic as transformers' with one op (a flip) instead of a neg and a cat.
        self.cos = cos
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [T, 1, D] at the step's token positions, shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate x [T, heads, D] (a view is fine) with the step's tables."""
        cos, signed_sin = tables
        t, heads, dim = x.shape
        flipped = x.reshape(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)
        return x * cos + flipped * signed_sin
