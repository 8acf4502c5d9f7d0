from __future__ import annotations

import torch

from flakecheck.kernels import Ops


class Linear:
    """y = x @ W.T (+ b) through the policy's matmul."""

    def __init__(self, ops: Ops, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.ops, self.weight, self.bias = ops, weight.contiguous(), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias)

    @classmethod
    def fused(cls, ops: Ops, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None) -> Linear:
        """One matmul for several projections of the same input (qkv, gate+up): fewer kernel launches."""
        bias = torch.cat(biases) if biases else None
        return cls(ops, torch.cat(weights), bias)
