from __future__ import annotations

import torch

from flakecheck.kernels import BatchLayout, Ops


class Linear:
    """y = x @ W.T (+ b) through the policy's matmul; what the policy derives from W is made here,
    when the model is built."""

    def __init__(self, ops: Ops, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.ops = ops
        self.weights = ops.prepare_linear(weight, bias)
        self.shape = self.weights.shape  # (N, K): the key of this projection's order in a step plan

    def __call__(self, x: torch.Tensor, layout: BatchLayout | None = None) -> torch.Tensor:
        groups = layout.projection(*self.shape) if layout is not None else None
        return self.ops.linear(x, self.weights, groups=groups)

    @classmethod
    def fused(cls, ops: Ops, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None) -> Linear:
        """One matmul for several projections of the same input (qkv, gate+up): fewer kernel launches."""
        bias = torch.cat(biases) if biases else None
        return cls(ops, torch.cat(weights), bias)
