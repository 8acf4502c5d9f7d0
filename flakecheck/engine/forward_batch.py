"""What one engine step feeds the model: the packed tokens of every scheduled sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flakecheck.kernels import AttentionBatch


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T] packed tokens: prefill chunks and decode tokens together
    positions: torch.Tensor  # [T] each token's position in its own sequence
    cache_rows: torch.Tensor  # [T] each token's row in a layer's KV cache viewed as [slots * length, ...]
    attention: AttentionBatch
    sample_rows: torch.Tensor | None  # packed rows that sample (the last of each finished prompt); None: all
