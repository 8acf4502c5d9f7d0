"""OLMoE as transformers configures it: Llama's layout with a q/k RMSNorm over each whole projection and routed
experts on every layer (softmax, top-k, renormalised when `norm_topk_prob`). `clip_qkv` is refused."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import PROJECTION, Traits, activation_of
from flakecheck.engine.models.family import Family
from flakecheck.engine.models.qwen_moe import experts_of
from flakecheck.errors import ModelError


def _olmoe(hf: Any, source: str) -> Traits:
    if getattr(hf, "clip_qkv", None) is not None:
        raise ModelError(f"{source}: OLMoE's clip_qkv={hf.clip_qkv} is not supported")
    return Traits(activation=activation_of(hf, source, ("silu",)), qk_norm=PROJECTION,
                  experts=experts_of(hf, hf.intermediate_size))


OLMOE = Family("OLMoE", ("OlmoeForCausalLM",), ("olmoe",), _olmoe, "olmoe.modeling_olmoe", "OlmoeRotaryEmbedding")
