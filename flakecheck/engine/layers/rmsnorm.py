from __future__ import annotations

import torch

from flakecheck.kernels import Ops
from flakecheck.kernels.layout import Groups


class RMSNorm:
    """RMSNorm through the policy's row reduction. `style` is the family's epilogue: `dtype` (Llama: the weight
    scales the values rounded to the model dtype), `fp32` (OLMo 2: the weight scales the fp32 values, then one
    rounding), `offset` (Gemma: 1 + weight, likewise in fp32). The backends read it from the weight's dtype."""

    def __init__(self, ops: Ops, weight: torch.Tensor, eps: float, style: str = "dtype") -> None:
        if style == "offset":
            weight = 1.0 + weight.float()
        elif style == "fp32":
            weight = weight.float()
        self.ops, self.weight, self.eps = ops, weight, eps

    def __call__(self, x: torch.Tensor, groups: Groups | None = None) -> torch.Tensor:
        return self.ops.rmsnorm(x, self.weight, self.eps, groups)
