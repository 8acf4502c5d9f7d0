"""What one engine step feeds the model: the packed tokens of every scheduled sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flakecheck.kernels import AttentionBatch


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T] packed tokens: prefill chunks and decode tokens together
    positions: torch.Tensor  # [T] each token's position in its own sequence
    token_slots: torch.Tensor  # [T] each token's KV-cache slot
    attention: AttentionBatch
    sample_rows: torch.Tensor  # packed row of the last token of every sequence that samples this step
