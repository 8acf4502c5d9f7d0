from __future__ import annotations

import torch

from flakecheck.kernels import Ops
from flakecheck.kernels.layout import Groups


class RMSNorm:
    def __init__(self, ops: Ops, weight: torch.Tensor, eps: float) -> None:
        self.ops, self.weight, self.eps = ops, weight, eps

    def __call__(self, x: torch.Tensor, groups: Groups | None = None) -> torch.Tensor:
        return self.ops.rmsnorm(x, self.weight, self.eps, groups)
