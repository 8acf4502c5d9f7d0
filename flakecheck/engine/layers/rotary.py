from __future__ import annotations

from typing import Any

import torch


class RotaryEmbedding:
    """RoPE tables from the family's own transformers rotary module (theta, scaling type and attention factor
    from the config's rope_parameters; `layer_type` for families whose layer kinds have their own bases),
    looked up once a step and applied to q and k of every layer that reads them."""

    def __init__(self, rotary: Any, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                 layer_type: str | None = None) -> None:
        positions = torch.arange(max_len)[None, :]
        x = torch.empty(0, dtype=torch.float32)
        cos, sin = rotary(x, positions) if layer_type is None else rotary(x, positions, layer_type)
        # Hugging Face casts the fp32 tables to the activation dtype before rotating; so do we.
        cos, sin = cos[0].to(device=device, dtype=dtype), sin[0].to(device=device, dtype=dtype)
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == flip_halves(x) * [-sin | sin]: negation is exact, so this is the
        # same arithmetic as transformers' with one op (a flip) instead of a neg and a cat.
        self.cos = cos
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [T, 1, R] at the step's token positions, shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate x [T, heads, D] (a view is fine) with the step's tables; where the tables are narrower than
        D (a partial rotary factor), the first R dims rotate and the rest pass through."""
        cos, signed_sin = tables
        t, heads, dim = x.shape
        rot = cos.shape[-1]
        if rot < dim:
            return torch.cat((RotaryEmbedding.apply(x[..., :rot], tables), x[..., rot:]), dim=-1)
        flipped = x.reshape(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)
        return x * cos + flipped * signed_sin
