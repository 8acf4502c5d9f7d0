from __future__ import annotations

import torch

from flakecheck.engine.layers.parallel import Sharding, sharded_linear
from flakecheck.kernels import BatchLayout, Ops
from flakecheck.kernels.layout import ShardedGroups, ShardOrder
from flakecheck.kernels.ops import by_groups


class Linear:
    """y = x @ W.T (+ b) through the policy's matmul; what the policy derives from W is made here,
    when the model is built. With a `sharding`, the rows of a tensor-parallel step run as its ranks do."""

    def __init__(self, ops: Ops, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 sharding: Sharding | None = None) -> None:
        self.ops, self.sharding = ops, sharding
        self.weights = ops.prepare_linear(weight, bias)
        self.shape = self.weights.shape  # (N, K): the key of this projection's order in a step plan

    def __call__(self, x: torch.Tensor, layout: BatchLayout | None = None) -> torch.Tensor:
        if layout is None:
            return self.ops.linear(x, self.weights)
        return self.run(x, layout.sharded(*self.shape))

    def run(self, x: torch.Tensor, groups: ShardedGroups) -> torch.Tensor:
        """x's rows in their groups: one rank's rows (every step at TP 1) in the one call they always made."""
        if all(key.tp == 1 for key, _ in groups):
            return self.ops.linear(x, self.weights, groups=tuple((key.order, rows) for key, rows in groups))
        return by_groups(x, groups, self._group)  # type: ignore[arg-type]

    def _group(self, x: torch.Tensor, key: ShardOrder) -> torch.Tensor:
        if key.tp == 1:
            return self.ops.linear(x, self.weights, groups=((key.order, slice(None)),))
        if self.sharding is None:
            raise ValueError(f"a projection of shape {self.shape} has no tensor-parallel sharding")
        w = self.weights
        shards = self.sharding.weights(self.ops, w.weight, w.bias, key.tp)
        return sharded_linear(self.ops, x, w, shards, self.sharding.kind, self.sharding.columns(key.tp, x.device), key)

    @classmethod
    def fused(cls, ops: Ops, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None,
              sharding: Sharding | None = None) -> Linear:
        """One matmul for several projections of the same input (qkv, gate+up): fewer kernel launches."""
        bias = torch.cat(biases) if biases else None
        return cls(ops, torch.cat(weights), bias, sharding)
