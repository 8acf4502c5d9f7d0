"""The mixture-of-experts decoder: the dense decoder with routed experts in place of the MLP of its sparse layers
(engine/layers/moe.py), over the weights as transformers 5 holds them: per sparse layer `mlp.gate.weight` [E, H]
(the router), `mlp.experts.gate_up_proj` [E, 2I, H] (each expert's gate then up) and `mlp.experts.down_proj`
[E, H, I], whatever names the checkpoint stores (Mixtral's `block_sparse_moe.experts.N.w1` ...)."""

from __future__ import annotations

from typing import Any

import torch

from flakecheck.engine.layers.activation import GATED_ACTIVATIONS
from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.moe import Expert, SparseMoE
from flakecheck.engine.model_config import Experts
from flakecheck.engine.models.decoder import DecoderLM, Weights
from flakecheck.engine.routing import RowRouting, row_routing


class MoeLM(DecoderLM):
    """A decoder whose sparse layers route each row to its top-k experts (each layer's block keeps its last call's
    routing margins and chosen experts: `SparseMoE.margins`, `.chosen`)."""

    @property
    def experts(self) -> Experts:
        moe = self.config.traits.experts
        assert moe is not None
        return moe

    def routing(self, rows: torch.Tensor | None) -> list[RowRouting]:
        """Per sampling row of the last forward pass (`rows` of it; every row when None): its routing."""
        sparse = [(i, layer.mlp) for i, layer in enumerate(self.layers) if isinstance(layer.mlp, SparseMoE)]
        assert all(m.margins is not None and m.chosen is not None for _, m in sparse), "no forward pass yet"
        return row_routing([i for i, _ in sparse], [m.margins for _, m in sparse],  # type: ignore[misc]
                           [m.chosen for _, m in sparse], rows)  # type: ignore[misc]

    def _mlp(self, i: int, w: Weights) -> Any:
        moe = self.experts
        if not moe.sparse_layers[i]:
            return super()._mlp(i, w)
        ops, p = self.ops, f"model.layers.{i}.mlp."
        activation = GATED_ACTIVATIONS[self.config.traits.activation]
        gate_up, down = w[f"{p}experts.gate_up_proj"], w[f"{p}experts.down_proj"]
        experts = [Expert(ops, gate_up[e], down[e], activation) for e in range(moe.num_experts)]
        shared = gate = None
        if moe.shared_intermediate_size:
            shared = self._dense_mlp(w, f"{p}shared_expert.", moe.shared_intermediate_size)
            gate = Linear(ops, w[f"{p}shared_expert_gate.weight"])
        return SparseMoE(ops, Linear(ops, w[f"{p}gate.weight"]), experts, moe.top_k, moe.norm_topk_prob,
                         moe.weights_fp32, shared, gate)
