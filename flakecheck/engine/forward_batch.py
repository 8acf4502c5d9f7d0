"""What one forward pass feeds the model: the packed tokens of every scheduled sequence of one or
more steps, where each step's rows are, and the attention metadata built once for every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from flakecheck.kernels import BatchLayout


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T] packed tokens: prefill chunks and decode tokens together
    positions: torch.Tensor  # [T] each token's position in its own sequence
    cache_rows: torch.Tensor  # [T] each token's row in a layer's KV cache viewed as [slots * length, ...]
    # the backend's attention metadata for this pass (Ops.attention_meta), per sliding window (None: full attention)
    attention: dict[int | None, Any]
    layout: BatchLayout | None  # row groups per op (None: every op plans its input as one step)
    sample_rows: torch.Tensor | None  # packed rows that sample (the last of each finished prompt); None: all
    # (packed rows, cache rows): keys and values a row also writes for another sequence that needs the same
    # computation (simulated replay computes it once); None: none
    fanout: tuple[torch.Tensor, torch.Tensor] | None = None
