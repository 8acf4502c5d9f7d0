"""Kernel policies, per op class: which reduction order each class of op follows.

A policy names one order for every reduction (`splitk`, `invariant`, `native`) or one per op class,
e.g. `matmul=splitk,attention=invariant,norm=invariant` (classes not named are fixed-order):

- `matmul`: every projection and the LM head (split-K under `splitk`);
- `attention`: the attention reduction over keys (split-KV under `splitk`);
- `norm`: the row reductions of RMSNorm and of the log-softmax over the vocabulary (split rows
  under `splitk`).

A mixture of experts' two kinds of matmul follow `matmul` unless named apart (`router=...`, `experts=...`):
`router` the router's projection, `experts` the routed experts' matmuls (whose order follows the rows routed
to each expert). `explain` replays each alone to tell a routing flip from a per-expert split plan's.

`tp-invariant` is `invariant` made independent of the tensor-parallel size as well: every matmul reduces
K in fixed TP_BLOCK-wide fp32 partials summed in block order (ranks exchange the partials unrounded), the
log-softmax sums in fixed vocabulary blocks; attention and RMSNorm, which no rank splits, are fixed-order.
"""

from __future__ import annotations

from dataclasses import dataclass

from flakecheck.kernels.plan import BLOCKED, FIXED, NATIVE, MatmulRule, ModelDims, StepPlan, StepShape
from flakecheck.kernels.profiles import attention_splits, kv_chunk_size, row_splits
from flakecheck.kernels.tensor_parallel import (
    TP_INVARIANT,
    TensorParallel,
    kv_heads_per_rank,
    resolve_allreduce,
    shard_bounds,
)

OP_CLASSES = ("matmul", "attention", "norm")
MOE_CLASSES = ("router", "experts")  # matmuls of a mixture of experts that may take another order than `matmul`
ORDERS = ("splitk", "invariant", "native", TP_INVARIANT)
FIXED_ORDERS = ("invariant", TP_INVARIANT)  # an op class under either runs a batch-invariant order
KV_SPLIT_SIZE = 256  # keys a split of the fixed-order attention, whatever the batch


@dataclass(frozen=True)
class KernelPolicy:
    matmul: str = "invariant"
    attention: str = "invariant"
    norm: str = "invariant"
    router: str | None = None  # a mixture of experts' router matmul (None: as `matmul`)
    experts: str | None = None  # its routed experts' matmuls (None: as `matmul`)

    @classmethod
    def of(cls, order: str) -> KernelPolicy:
        """One order for every op class: `splitk`, `invariant` or `native`."""
        return cls(order, order, order)

    @property
    def name(self) -> str:
        """`splitk` when every class follows it, else the per-class spelling."""
        orders = {self.matmul, self.attention, self.norm}
        apart = [f"{cls}={getattr(self, cls)}" for cls in MOE_CLASSES if getattr(self, cls) is not None]
        if len(orders) == 1 and not apart:
            return self.matmul
        return ",".join([f"{cls}={getattr(self, cls)}" for cls in OP_CLASSES] + apart)

    @property
    def router_order(self) -> str:
        return self.router or self.matmul

    @property
    def experts_order(self) -> str:
        return self.experts or self.matmul

    @property
    def matmul_orders(self) -> frozenset[str]:
        """Every matmul order the policy plans (what a model's weights must be prepared for)."""
        return frozenset({self.matmul, self.router_order, self.experts_order})

    @property
    def all_native(self) -> bool:
        """Every op class on the framework's own kernels: no Triton kernel and no twin is planned."""
        return self.matmul_orders == {"native"} and self.attention == self.norm == "native"

    @property
    def physical(self) -> bool:
        """Whether results depend on the physical batch (the framework's own kernels somewhere)."""
        return "native" in (*self.matmul_orders, self.attention, self.norm)


UNIFORM_POLICIES = {order: KernelPolicy.of(order) for order in ORDERS}  # one order for every op class, by name


def parse_policy(spec: str) -> KernelPolicy:
    """`splitk`, `invariant`, `native`, or `class=order,...` over matmul, attention, norm (and a mixture of
    experts' router and experts). ValueError if bad."""
    text = spec.strip()
    if text in UNIFORM_POLICIES:
        return UNIFORM_POLICIES[text]
    orders: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = (p.strip() for p in part.partition("="))
        if not sep:
            raise ValueError(f"unknown kernel policy {spec!r}; choose {', '.join(ORDERS)}, or one per op class, "
                             "e.g. matmul=splitk,attention=invariant,norm=invariant")
        if key not in OP_CLASSES + MOE_CLASSES:
            raise ValueError(f"{spec!r}: unknown op class {key!r}; choose among {', '.join(OP_CLASSES + MOE_CLASSES)}")
        if value not in ORDERS:
            raise ValueError(f"{spec!r}: unknown order {value!r} for {key}; choose among {', '.join(ORDERS)}")
        if key in orders:
            raise ValueError(f"{spec!r}: {key} given twice")
        orders[key] = value
    return KernelPolicy(**orders)


def matmul_order(policy: KernelPolicy, m: int, n: int, k: int, sms: int) -> int:
    """A [m, k] x [k, n] matmul's order under the policy: split-K count from the heuristic, fixed, or native
    (`MatmulRule`)."""
    return MatmulRule(policy.matmul, sms).order(m, n, k)


def norm_order(policy: KernelPolicy, rows: int, sms: int) -> int:
    """A row reduction's order (RMSNorm, log-softmax) over `rows` rows: row splits, fixed, or native."""
    if policy.norm == "splitk":
        return row_splits(rows, sms)
    return FIXED if policy.norm in FIXED_ORDERS else NATIVE


def attention_split(policy: KernelPolicy, shape: StepShape, kv_heads: int, sms: int, window: int | None = None) -> int:
    """Keys per attention split of every sequence of the step: from the split-KV heuristic over the
    whole step (`splitk`; `kv_heads`: those of one rank; a sliding `window` caps the keys a sequence reduces
    over, as a windowed flash-decoding kernel sees them), the fixed size, or NATIVE."""
    if policy.attention == "splitk":
        longest = max(shape.context_lens) if window is None else min(max(shape.context_lens), window)
        splits = attention_splits(shape.num_seqs, kv_heads, max(shape.query_lens), longest, sms)
        return kv_chunk_size(longest, splits)
    return KV_SPLIT_SIZE if policy.attention in FIXED_ORDERS else NATIVE


def shard_shape(dims: ModelDims, n: int, k: int, size: int) -> tuple[int, int]:
    """The (N, K) of one rank's GEMM of an (N, K) projection at `size` ranks: a row-parallel one's K shard,
    the qkv's columns of its heads, any other's (and the LM head's) column shard."""
    if size == 1 or dims.sharded is None:
        return n, k
    if (n, k) in dims.row_parallel:
        return n, k // size
    if (n, k) == dims.qkv:
        s = dims.sharded
        return (s.heads // size + 2 * kv_heads_per_rank(s.kv_heads, size)) * s.head_dim, k
    lo, hi = shard_bounds(n, size)[0]
    return hi - lo, k


def plan_step(policy: KernelPolicy, shape: StepShape, dims: ModelDims, sms: int,
              tp: TensorParallel = TensorParallel()) -> StepPlan:
    """The reduction order of every op of one step: the one description of each policy that every
    backend executes. `splitk` derives split counts from the step's shape through the device
    profile's heuristics (flakecheck/kernels/profiles.py) — each rank's shard's shape under tensor
    parallelism; `invariant` fixes them; `native` defers to the framework's kernels. `tp`: the ranks and the
    all-reduce asked for (`auto` resolved here from the step's message size)."""
    rows, samples, size = shape.num_rows, shape.num_sample_rows, tp.size
    if size > 1 and dims.sharded is None:
        raise ValueError("this model has no tensor-parallel layout")

    def order(m: int, n: int, k: int, matmul: str = policy.matmul) -> int:
        rule = MatmulRule(matmul, sms)
        if matmul == TP_INVARIANT:  # blocks of the whole K: every rank's blocks are among them
            return rule.order(m, n, k)
        return rule.order(m, *shard_shape(dims, n, k, size))

    if size > 1 and policy.matmul == TP_INVARIANT:
        allreduce = TP_INVARIANT
    else:
        message = rows * (dims.sharded.hidden * dims.sharded.act_bytes if dims.sharded else 0)
        allreduce = resolve_allreduce(tp.allreduce, size, message)
    kv_heads = kv_heads_per_rank(dims.kv_heads, size)
    return StepPlan(
        projections=tuple((nk, order(rows, *nk, policy.router_order if nk == dims.router else policy.matmul))
                          for nk in dims.projections),
        lm_head=order(samples, *dims.lm_head),
        kv_split=attention_split(policy, shape, kv_heads, sms),
        window_kv_splits=tuple((w, attention_split(policy, shape, kv_heads, sms, w)) for w in dims.windows),
        norms=tuple((r, norm_order(policy, rows * r, sms)) for r in dims.norm_rows_per_token),
        final=BLOCKED if policy.norm == TP_INVARIANT else norm_order(policy, samples, sms),
        tp=TensorParallel(size, allreduce),
        experts=MatmulRule(policy.experts_order, sms) if dims.experts else None,
    )
