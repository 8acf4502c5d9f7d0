"""The one interface every reduction of the model goes through: a kernel policy on a backend.

The engine never calls a matmul, a softmax or a norm directly: it calls an `Ops`. Once a step,
`plan_step` turns the step's shape into a StepPlan (the policy's description, the same for every
backend); once a forward pass, the engine lays out the rows of its steps (flakecheck/kernels/layout.py); every
layer then hands its op the row groups of its order, and the backend runs each group.

Called without groups (a standalone call, as the tests and benchmarks make), an op plans itself
as if its input were one whole step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from flakecheck.kernels.layout import AttentionLayout, Groups
from flakecheck.kernels.plan import ModelDims, StepPlan, StepShape
from flakecheck.kernels.policy import KernelPolicy, attention_split, matmul_order, norm_order, plan_step
from flakecheck.kernels.profiles import get_profile
from flakecheck.kernels.tensor_parallel import TensorParallel
from flakecheck.kernels.weights import LinearWeights


class Backend(Protocol):
    name: str

    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None, orders: set[str]) -> LinearWeights: ...
    def linear(self, x: torch.Tensor, w: LinearWeights, order: int) -> torch.Tensor: ...
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, order: int) -> torch.Tensor: ...
    def log_softmax(self, logits: torch.Tensor, order: int) -> torch.Tensor: ...
    def attention_meta(self, layout: AttentionLayout, group: int, device: torch.device) -> Any: ...
    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any,
                  scale: float, softcap: float | None = None) -> torch.Tensor: ...


class Ops:
    def __init__(self, policy: KernelPolicy, backend: Backend, profile: str | None = None,
                 matmul_orders: frozenset[str] = frozenset()) -> None:
        self.policy, self.executor = policy, backend
        self.profile = profile
        self.sms = get_profile(profile).sms
        # the matmul orders the weights are prepared for: the policy's own, and any other policy's a
        # caller plans steps with (`plan_step(..., policy=...)`, e.g. to replay one mechanism at a time)
        self.matmul_orders = policy.matmul_orders | matmul_orders

    # ------------------------------------------------------------------------- once a model, a step

    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> LinearWeights:
        """What this policy's matmuls read from a weight, made once when the model is built."""
        return self.executor.prepare_linear(weight, bias, set(self.matmul_orders))

    def plan_step(self, shape: StepShape, dims: ModelDims, policy: KernelPolicy | None = None,
                  tp: TensorParallel = TensorParallel()) -> StepPlan:
        """The step's plan under this Ops' policy, or another whose matmul orders the weights are prepared for;
        at `tp` ranks (one by default)."""
        policy = policy or self.policy
        if not policy.matmul_orders <= self.matmul_orders:
            raise ValueError(f"weights are not prepared for {', '.join(sorted(policy.matmul_orders))} matmuls")
        return plan_step(policy, shape, dims, self.sms, tp)

    def attention_meta(self, layout: AttentionLayout, group: int, device: torch.device) -> Any:
        """The backend's per-forward attention metadata (masks, row groups), built once for every layer."""
        return self.executor.attention_meta(layout, group, device)

    # ------------------------------------------------------------------------------------- the ops

    def linear(self, x: torch.Tensor, w: LinearWeights | torch.Tensor, bias: torch.Tensor | None = None,
               groups: Groups | None = None) -> torch.Tensor:
        """x [M, K] @ weight[N, K].T (+ bias) in the activation dtype, fp32 accumulation."""
        if not isinstance(w, LinearWeights):
            w = self.prepare_linear(w, bias)
        if groups is None:
            n, k = w.shape
            groups = ((matmul_order(self.policy, x.shape[0], n, k, self.sms), slice(None)),)
        return by_groups(x, groups, lambda rows, order: self.executor.linear(rows, w, order))

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, groups: Groups | None = None) -> torch.Tensor:
        """Hugging Face's RMSNorm over the last dim; rows are the other dims flattened."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if groups is None:
            groups = ((norm_order(self.policy, flat.shape[0], self.sms), slice(None)),)
        return by_groups(flat, groups, lambda rows, order: self.executor.rmsnorm(rows, weight, eps, order)).view(shape)

    def log_softmax(self, logits: torch.Tensor, groups: Groups | None = None) -> torch.Tensor:
        """fp32 log-softmax over the last dimension (the vocabulary)."""
        if groups is None:
            groups = ((norm_order(self.policy, logits.numel() // logits.shape[-1], self.sms), slice(None)),)
        return by_groups(logits, groups, lambda rows, order: self.executor.log_softmax(rows, order),
                         dtype=torch.float32)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionLayout | Any, scale: float, softcap: float | None = None) -> torch.Tensor:
        """Causal attention of packed queries q [T, H, D] over the cache [slots, L, KVH, D], its scores
        soft-capped where `softcap` is set. `meta` is the forward pass's metadata, or (standalone) an
        AttentionLayout planned here as one step."""
        if isinstance(meta, AttentionLayout):
            layout = meta
            if layout.kv_splits is None:
                shape = StepShape(tuple(layout.query_len(i) for i in range(layout.num_seqs)),
                                  tuple(layout.context_lens), 0)
                split = attention_split(self.policy, shape, k_cache.shape[2], self.sms, layout.window)
                layout = AttentionLayout(layout.slots, layout.query_starts, layout.context_lens,
                                         [split] * layout.num_seqs, layout.window)
            meta = self.attention_meta(layout, q.shape[1] // k_cache.shape[2], q.device)
        return self.executor.attention(q, k_cache, v_cache, meta, scale, softcap)


def by_groups(x: torch.Tensor, groups: Groups, run: Callable[[torch.Tensor, int], torch.Tensor],
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """Run each group's rows of x [R, ...] under its order; rows come back in place. A group that is
    every row runs on x itself (no gather)."""
    if len(groups) == 1 and isinstance(groups[0][1], slice) and groups[0][1] in (slice(None), slice(0, x.shape[0])):
        return run(x, groups[0][0])
    out: torch.Tensor | None = None
    for order, rows in groups:
        part = run(x[rows] if isinstance(rows, slice) else x.index_select(0, rows), order)
        if out is None:
            out = torch.empty((x.shape[0], *part.shape[1:]), dtype=dtype or part.dtype, device=x.device)
        if isinstance(rows, slice):
            out[rows] = part
        else:
            out.index_copy_(0, rows, part)
    assert out is not None
    return out
