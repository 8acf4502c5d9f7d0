"""The engine-kernels contract: a step's shape in, a typed plan of reduction orders out.

The policy sees one step's shape once (`policy.plan_step`) and returns a StepPlan that every layer
of that step executes, on any backend. A plan entry is an *order*:

- FIXED: the fixed-order (batch-invariant) kernel;
- NATIVE: the framework's own kernel, whose order depends on the physical batch;
- S >= 1: a split reduction in S parts (split-K matmul, S row splits for norms), partials added in order;
- BLOCKED: the log-softmax of the tp-invariant order (exponentials summed in fixed vocabulary blocks).

A step also says its tensor parallelism (flakecheck/kernels/tensor_parallel.py): how many ranks, and the
all-reduce that sums their partials; its projection orders are those of each rank's shard.

For attention the entry is the number of keys per split (NATIVE for the framework's kernel).

A mixture-of-experts step also carries a rule (`MatmulRule`) rather than orders for its expert matmuls: how
many rows an expert gets is known only once the router has run inside the forward pass, so the plan says how
a routed row count becomes an order, by the same heuristics as every other matmul of the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flakecheck.kernels.profiles import matmul_splits, split_bounds
from flakecheck.kernels.tensor_parallel import TP_BLOCK, TP_INVARIANT, ShardedDims, TensorParallel

FIXED = 0
NATIVE = -1
BLOCKED = -2


@dataclass(frozen=True)
class MatmulRule:
    """A matmul's order from its shape under a policy's matmul order (`splitk`, `invariant`, `native`,
    `tp-invariant`) on a device of `sms` SMs."""

    matmul: str
    sms: int

    def order(self, m: int, n: int, k: int) -> int:
        """The [m, k] x [k, n] matmul's order: under `splitk` the number of K ranges the heuristic's splits
        really make (6, 7 and 8 splits of K=576 all cut it into six 96-wide ranges, so that steps computing the
        same thing share one call); `tp-invariant`: K in TP_BLOCK-wide ranges whatever the batch; fixed or
        native otherwise."""
        if self.matmul == "splitk":
            return len(split_bounds(k, matmul_splits(max(m, 1), n, k, self.sms)))
        if self.matmul == TP_INVARIANT:
            return max(1, math.ceil(k / TP_BLOCK))
        return FIXED if self.matmul == "invariant" else NATIVE

    @property
    def follows_batch(self) -> bool:
        """Whether the order depends on the rows a matmul gets (so, for routed experts, on the step's other rows)."""
        return self.matmul in ("splitk", "native")


@dataclass(frozen=True)
class ModelDims:
    """The reduction shapes of a model that a plan covers."""

    projections: tuple[tuple[int, int], ...]  # (N, K) of every projection over the step's hidden rows
    lm_head: tuple[int, int]
    kv_heads: int
    norm_rows_per_token: tuple[int, ...] = (1,)  # 1: hidden-state norms; heads: per-head q/k norms
    # how tensor parallelism shards it (None: a model that is never sharded): the fused qkv projection,
    # whose columns follow the heads, and the row-parallel projections, whose K is sharded; every other
    # projection is column-parallel
    sharded: ShardedDims | None = None
    qkv: tuple[int, int] | None = None
    row_parallel: tuple[tuple[int, int], ...] = ()
    windows: tuple[int, ...] = ()  # the sliding windows of layers that have one (keys a query sees, itself included)
    experts: tuple[tuple[int, int], ...] = ()  # (N, K) of the routed experts' matmuls (a mixture of experts)
    router: tuple[int, int] | None = None  # (N, K) of its router's projection, one of `projections`


@dataclass(frozen=True)
class StepShape:
    """One engine step as the policy sees it: per sequence, its new rows and its context after the step."""

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    num_sample_rows: int

    @property
    def num_rows(self) -> int:
        return sum(self.query_lens)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


@dataclass(frozen=True)
class StepPlan:
    projections: tuple[tuple[tuple[int, int], int], ...]  # ((N, K), order) for every projection
    lm_head: int
    kv_split: int  # keys per attention split of the full-attention layers, or NATIVE
    norms: tuple[tuple[int, int], ...]  # (rows per token, order)
    final: int  # the final norm and the log-softmax, over the sampling rows
    tp: TensorParallel = TensorParallel()  # the ranks, and the all-reduce this step's message size selects
    # (window, keys per split) of the sliding-window layers: a window shortens what a split-KV heuristic sees
    window_kv_splits: tuple[tuple[int, int], ...] = ()
    # a mixture of experts: how each expert's matmuls take their order from the rows routed to it in this step
    experts: MatmulRule | None = None

    @property
    def attention_splits(self) -> tuple[tuple[int | None, int], ...]:
        """(window or None for full attention, keys per split) of every kind of attention layer."""
        return ((None, self.kv_split), *self.window_kv_splits)

    def projection(self, n: int, k: int) -> int:
        for shape, order in self.projections:
            if shape == (n, k):
                return order
        raise KeyError(f"the plan covers no projection of shape N={n}, K={k}")

    def norm(self, rows_per_token: int) -> int:
        for rows, order in self.norms:
            if rows == rows_per_token:
                return order
        raise KeyError(f"the plan covers no norm over {rows_per_token} rows a token")
