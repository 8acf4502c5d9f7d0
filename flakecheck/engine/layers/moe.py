"""A mixture-of-experts MLP: a router's matmul, each row's top-k experts, each expert's gated MLP over the rows
routed to it, the outputs combined by their routing weights; a shared expert beside them where the family has one.

Two mechanisms of batch composition live here besides the router's own matmul (a projection like any other):

- each expert's matmuls take their order from the number of the step's rows routed to that expert
  (`BatchLayout.routed`, by the step plan's expert rule), as a fused MoE kernel tiles its GEMMs by it;
- the combine: `invariant` and `splitk` add a row's k expert outputs in the row's own rank order (best first),
  whatever rows an expert got; `native` adds them as transformers does, `index_add_` expert by expert.

Each call also leaves its routing margins: per row, the gap between the k-th and the (k+1)-th router
probability (how near the row came to another choice of experts), and the experts it chose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from flakecheck.engine.layers.linear import Linear
from flakecheck.kernels import BatchLayout, Ops
from flakecheck.kernels.weights import LinearWeights


class DenseMLP(Protocol):
    def __call__(self, x: torch.Tensor, layout: BatchLayout | None) -> torch.Tensor: ...


class Expert:
    """One routed expert's gated MLP, its matmuls ordered by the rows routed to it (not the step's projections)."""

    def __init__(self, ops: Ops, gate_up: torch.Tensor, down: torch.Tensor,
                 activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.ops, self.activation = ops, activation
        self.gate_up, self.down = ops.prepare_linear(gate_up), ops.prepare_linear(down)

    def __call__(self, x: torch.Tensor, rows: torch.Tensor, layout: BatchLayout | None) -> torch.Tensor:
        """The expert over x's `rows` (ascending batch rows), in that order."""
        h = self._linear(x.index_select(0, rows), self.gate_up, rows, layout)
        return self._linear(self.activation(h), self.down, rows, layout)

    def _linear(self, x: torch.Tensor, w: LinearWeights, rows: torch.Tensor,
                layout: BatchLayout | None) -> torch.Tensor:
        groups = layout.routed(rows, *w.shape) if layout is not None else None
        return self.ops.linear(x, w, groups=groups)


class SparseMoE:
    """Router, top-k, experts, combine (and a sigmoid-gated shared expert where the family has one)."""

    def __init__(self, ops: Ops, router: Linear, experts: list[Expert], top_k: int, norm_topk_prob: bool,
                 weights_fp32: bool, shared: DenseMLP | None = None, shared_gate: Linear | None = None) -> None:
        self.ops, self.router, self.experts, self.top_k = ops, router, experts, top_k
        self.norm_topk_prob = norm_topk_prob
        # Mixtral multiplies an expert's output by the fp32 routing weight and rounds the product; Qwen-MoE and
        # OLMoE round the weight to the model dtype first
        self.weights_fp32 = weights_fp32
        self.shared, self.shared_gate = shared, shared_gate
        self.margins: torch.Tensor | None = None  # [rows] of the last call: k-th minus (k+1)-th router probability
        self.chosen: torch.Tensor | None = None  # [rows, k] of the last call: the experts each row chose, best first

    def __call__(self, x: torch.Tensor, layout: BatchLayout | None) -> torch.Tensor:
        probs = torch.softmax(self.router(x, layout).float(), dim=-1)
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        top, chosen = ranked[:, :self.top_k], order[:, :self.top_k]
        if ranked.shape[1] > self.top_k:
            self.margins = ranked[:, self.top_k - 1] - ranked[:, self.top_k]
        else:
            self.margins = torch.full((x.shape[0],), float("inf"), device=x.device)
        self.chosen = chosen
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        weights = top if self.weights_fp32 else top.to(x.dtype)
        out = self._combine(x, chosen, weights, layout)
        if self.shared is not None:
            shared = self.shared(x, layout)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x, layout)) * shared
            out = out + shared
        return out

    def _combine(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
                 layout: BatchLayout | None) -> torch.Tensor:
        if layout is None:
            native = self.ops.policy.experts_order == "native"
        else:
            native = any(s.plan.experts is not None and s.plan.experts.matmul == "native" for s in layout.segments)
        # per (row, rank): that rank's weighted expert output; native adds into one buffer expert by expert
        ranks = torch.zeros((x.shape[0], self.top_k, x.shape[1]), dtype=x.dtype, device=x.device) if not native \
            else None
        out = torch.zeros_like(x) if native else None
        for e, expert in enumerate(self.experts):
            hit = chosen == e
            rows = hit.any(dim=-1).nonzero().flatten()
            if rows.numel() == 0:
                continue
            rank = hit[rows].int().argmax(dim=-1)
            y = expert(x, rows, layout)
            y = (y * weights[rows, rank, None]).to(x.dtype)
            if out is not None:
                out.index_add_(0, rows, y)
            else:
                assert ranks is not None
                ranks[rows, rank] = y
        if out is not None:
            return out
        assert ranks is not None
        total = ranks[:, 0]
        for r in range(1, self.top_k):  # rank order, the same for every row whatever the experts' row counts
            total = total + ranks[:, r]
        return total
