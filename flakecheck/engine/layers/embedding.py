from __future__ import annotations

import torch
import torch.nn.functional as F

from flakecheck.engine.layers.linear import Linear
from flakecheck.kernels import BatchLayout, Ops


class Embedding:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)


class LMHead:
    """Logits in the activation dtype through the policy's matmul, then its fp32 log-softmax."""

    def __init__(self, ops: Ops, weight: torch.Tensor) -> None:
        self.ops, self.proj = ops, Linear(ops, weight)

    def __call__(self, hidden: torch.Tensor, layout: BatchLayout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits in the activation dtype, fp32 log-probabilities) of the sampling rows."""
        head = layout.lm_head() if layout is not None else None
        logits = self.ops.linear(hidden, self.proj.weights, groups=head)
        return logits, self.ops.log_softmax(logits, layout.final() if layout is not None else None)
