"""Kernel policies, per op class: which reduction order each class of op follows.

A policy names one order for every reduction (`splitk`, `invariant`, `native`) or one per op class,
e.g. `matmul=splitk,attention=invariant,norm=invariant` (classes not named are fixed-order):

- `matmul`: every projection and the LM head (split-K under `splitk`);
- `attention`: the attention reduction over keys (split-KV under `splitk`);
- `norm`: the row reductions of RMSNorm and of the log-softmax over the vocabulary (split rows
  under `splitk`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flakecheck.kernels.plan import FIXED, NATIVE, ModelDims, StepPlan, StepShape
from flakecheck.kernels.profiles import attention_splits, kv_chunk_size, matmul_splits, row_splits, split_bounds

OP_CLASSES = ("matmul", "attention", "norm")
ORDERS = ("splitk", "invariant", "native")
KV_SPLIT_SIZE = 256  # keys a split of the fixed-order attention, whatever the batch


@dataclass(frozen=True)
class KernelPolicy:
    matmul: str = "invariant"
    attention: str = "invariant"
    norm: str = "invariant"

    @classmethod
    def of(cls, order: str) -> KernelPolicy:
        """One order for every op class: `splitk`, `invariant` or `native`."""
        return cls(order, order, order)

    @property
    def name(self) -> str:
        """`splitk` when every class follows it, else the per-class spelling."""
        orders = {self.matmul, self.attention, self.norm}
        if len(orders) == 1:
            return self.matmul
        return ",".join(f"{cls}={getattr(self, cls)}" for cls in OP_CLASSES)

    @property
    def physical(self) -> bool:
        """Whether results depend on the physical batch (the framework's own kernels somewhere)."""
        return "native" in (self.matmul, self.attention, self.norm)


def parse_policy(spec: str) -> KernelPolicy:
    """`splitk`, `invariant`, `native`, or `class=order,...` over matmul, attention, norm. ValueError if bad."""
    text = spec.strip()
    if text in ORDERS:
        return KernelPolicy.of(text)
    orders: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = (p.strip() for p in part.partition("="))
        if not sep:
            raise ValueError(f"unknown kernel policy {spec!r}; choose {', '.join(ORDERS)}, or one per op class, "
                             "e.g. matmul=splitk,attention=invariant,norm=invariant")
        if key not in OP_CLASSES:
            raise ValueError(f"{spec!r}: unknown op class {key!r}; choose among {', '.join(OP_CLASSES)}")
        if value not in ORDERS:
            raise ValueError(f"{spec!r}: unknown order {value!r} for {key}; choose among {', '.join(ORDERS)}")
        if key in orders:
            raise ValueError(f"{spec!r}: {key} given twice")
        orders[key] = value
    return KernelPolicy(**orders)


def matmul_order(policy: KernelPolicy, m: int, n: int, k: int, sms: int) -> int:
    """A [m, k] x [k, n] matmul's order: split-K count from the heuristic, fixed, or native. The count
    is the number of K ranges the splits really make (6, 7 and 8 splits of K=576 all cut it into six
    96-wide ranges), so that steps computing the same thing share one call."""
    if policy.matmul == "splitk":
        return len(split_bounds(k, matmul_splits(max(m, 1), n, k, sms)))
    return FIXED if policy.matmul == "invariant" else NATIVE


def norm_order(policy: KernelPolicy, rows: int, sms: int) -> int:
    """A row reduction's order (RMSNorm, log-softmax) over `rows` rows: row splits, fixed, or native."""
    if policy.norm == "splitk":
        return row_splits(rows, sms)
    return FIXED if policy.norm == "invariant" else NATIVE


def attention_split(policy: KernelPolicy, shape: StepShape, kv_heads: int, sms: int) -> int:
    """Keys per attention split of every sequence of the step: from the split-KV heuristic over the
    whole step (`splitk`), the fixed size, or NATIVE."""
    if policy.attention == "splitk":
        longest = max(shape.context_lens)
        splits = attention_splits(shape.num_seqs, kv_heads, max(shape.query_lens), longest, sms)
        return kv_chunk_size(longest, splits)
    return KV_SPLIT_SIZE if policy.attention == "invariant" else NATIVE


def plan_step(policy: KernelPolicy, shape: StepShape, dims: ModelDims, sms: int) -> StepPlan:
    """The reduction order of every op of one step: the one description of each policy that every
    backend executes. `splitk` derives split counts from the step's shape through the device
    profile's heuristics (flakecheck/kernels/profiles.py); `invariant` fixes them; `native` defers to the
    framework's kernels."""
    rows, samples = shape.num_rows, shape.num_sample_rows
    return StepPlan(
        projections=tuple((nk, matmul_order(policy, rows, *nk, sms)) for nk in dims.projections),
        lm_head=matmul_order(policy, samples, *dims.lm_head, sms),
        kv_split=attention_split(policy, shape, dims.kv_heads, sms),
        norms=tuple((r, norm_order(policy, rows * r, sms)) for r in dims.norm_rows_per_token),
        final=norm_order(policy, samples, sms),
    )
