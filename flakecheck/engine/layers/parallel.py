"""A projection as N tensor-parallel ranks compute it (flakecheck/kernels/tensor_parallel.py has the model).

A `Sharding` says which columns each rank owns: output columns of a column-parallel projection (each rank's
GEMM runs over the whole K and writes its own columns), K columns of a row-parallel one (each rank's
partial GEMM is rounded to the activation dtype, then the all-reduce sums the partials). Each rank's weight
slice is prepared for the policy once per TP size, the first time a step runs at that size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flakecheck.kernels import Ops
from flakecheck.kernels.layout import ShardOrder
from flakecheck.kernels.tensor_parallel import TP_INVARIANT, all_reduce
from flakecheck.kernels.weights import LinearWeights

COLUMN, ROW = "column", "row"


@dataclass
class Sharding:
    kind: str  # COLUMN or ROW
    ranks: Callable[[int], list[torch.Tensor]]  # TP size -> each rank's columns (output columns, or K columns)
    _shards: dict[int, list[LinearWeights]] = field(default_factory=dict, repr=False)
    _columns: dict[tuple[int, torch.device], list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def columns(self, size: int, device: torch.device) -> list[torch.Tensor]:
        """Each rank's column indices, on the device of the tensors they index."""
        if (size, device) not in self._columns:
            self._columns[(size, device)] = [c.to(device) for c in self.ranks(size)]
        return self._columns[(size, device)]

    def weights(self, ops: Ops, weight: torch.Tensor, bias: torch.Tensor | None, size: int) -> list[LinearWeights]:
        """Each rank's slice of the weight, prepared for the policy (the bias: with its columns; of a
        row-parallel projection, on rank 0 alone, as vLLM adds it once before the all-reduce)."""
        if size not in self._shards:
            shards = []
            for r, columns in enumerate(self.columns(size, weight.device)):
                if self.kind == COLUMN:
                    shards.append(ops.prepare_linear(weight.index_select(0, columns),
                                                     None if bias is None else bias.index_select(0, columns)))
                else:
                    shards.append(ops.prepare_linear(weight.index_select(1, columns).contiguous(),
                                                     bias if r == 0 else None))
            self._shards[size] = shards
        return self._shards[size]


def sharded_linear(ops: Ops, x: torch.Tensor, full: LinearWeights, shards: list[LinearWeights], kind: str,
                   columns: list[torch.Tensor], key: ShardOrder) -> torch.Tensor:
    """x [M, K] @ W.T (+ b) as `key.tp` ranks compute it, each rank's GEMM under `key.order`."""
    one = ((key.order, slice(None)),)
    if kind == COLUMN:
        out = torch.empty((x.shape[0], full.shape[0]), dtype=x.dtype, device=x.device)
        for rank_columns, shard in zip(columns, shards):
            # ranks that replicate a KV head compute the same columns with the same GEMM: the same bits
            out[:, rank_columns] = ops.linear(x, shard, groups=one)
        return out
    if key.allreduce == TP_INVARIANT:
        # each rank's fp32 partials over its TP_BLOCK-wide K ranges, exchanged unrounded and summed in global
        # block order: the split-K GEMM over the whole K in those ranges (each range's partial GEMM has the
        # same bits whichever rank's call computes it), one rounding at the end
        return ops.linear(x, full, groups=one)
    partials = [ops.linear(x.index_select(1, rank_columns), shard, groups=one)
                for rank_columns, shard in zip(columns, shards)]
    return all_reduce(partials, key.allreduce)
