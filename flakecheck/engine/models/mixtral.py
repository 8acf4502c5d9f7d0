"""Mixtral as transformers configures it: Mistral's attention (a window on every layer where the config sets one)
and routed experts on every layer; the top-k probabilities always renormalised, each expert's output times its
fp32 weight."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import Experts, Traits, activation_of, layer_windows
from flakecheck.engine.models.family import Family


def _mixtral(hf: Any, source: str) -> Traits:
    experts = Experts(hf.num_local_experts, hf.num_experts_per_tok, hf.intermediate_size, norm_topk_prob=True,
                      sparse_layers=(True,) * hf.num_hidden_layers, weights_fp32=True)
    return Traits(activation=activation_of(hf, source, ("silu",)), layer_windows=layer_windows(hf, every_layer=True),
                  experts=experts)


MIXTRAL = Family("Mixtral", ("MixtralForCausalLM",), ("mixtral",), _mixtral, "mixtral.modeling_mixtral",
                 "MixtralRotaryEmbedding")
