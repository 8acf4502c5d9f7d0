"""Qwen2-MoE and Qwen3-MoE as transformers configures them: Qwen2's and Qwen3's attention, routed experts on the
layers `decoder_sparse_step` and `mlp_only_layers` leave sparse (a dense MLP on the others), the top-k
probabilities renormalised when `norm_topk_prob`; Qwen2-MoE adds a sigmoid-gated shared expert."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import HEAD, Experts, Traits, activation_of, layer_windows
from flakecheck.engine.models.family import Family


def experts_of(hf: Any, intermediate_size: int, shared: int = 0) -> Experts:
    """The routed experts of a Qwen-style config (OLMoE's too: every layer sparse there)."""
    n = hf.num_experts
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    step = getattr(hf, "decoder_sparse_step", None) or 1
    sparse = tuple(i not in dense and n > 0 and (i + 1) % step == 0 for i in range(hf.num_hidden_layers))
    return Experts(n, hf.num_experts_per_tok, intermediate_size, bool(hf.norm_topk_prob), sparse, shared)


def _qwen2_moe(hf: Any, source: str) -> Traits:
    experts = experts_of(hf, hf.moe_intermediate_size, hf.shared_expert_intermediate_size or 0)
    return Traits(activation=activation_of(hf, source, ("silu",)), layer_windows=layer_windows(hf), experts=experts)


def _qwen3_moe(hf: Any, source: str) -> Traits:
    return Traits(activation=activation_of(hf, source, ("silu",)), layer_windows=layer_windows(hf, every_layer=True),
                  qk_norm=HEAD, experts=experts_of(hf, hf.moe_intermediate_size))


QWEN2_MOE = Family("Qwen2-MoE", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), _qwen2_moe, "qwen2_moe.modeling_qwen2_moe",
                   "Qwen2MoeRotaryEmbedding")
QWEN3_MOE = Family("Qwen3-MoE", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), _qwen3_moe, "qwen3_moe.modeling_qwen3_moe",
                   "Qwen3MoeRotaryEmbedding")
