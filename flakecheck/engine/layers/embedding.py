from __future__ import annotations

import torch
import torch.nn.functional as F

from flakecheck.kernels import Ops


class Embedding:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)


class LMHead:
    """Logits in the activation dtype through the policy's matmul, then its fp32 log-softmax."""

    def __init__(self, ops: Ops, weight: torch.Tensor) -> None:
        self.ops, self.weight = ops, weight.contiguous()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ops.log_softmax(self.ops.linear(hidden, self.weight))
