"""Granite (3.x) as transformers configures it: Llama with an embedding multiplier, a residual multiplier on every
block's output, attention scaled by attention_multiplier, and logits divided by logits_scaling."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import Traits, activation_of
from flakecheck.engine.models.family import Family


def _granite(hf: Any, source: str) -> Traits:
    return Traits(activation=activation_of(hf, source, ("silu",)), embed_scale=hf.embedding_multiplier,
                  residual_multiplier=hf.residual_multiplier, attention_scale=hf.attention_multiplier,
                  logits_divisor=hf.logits_scaling)


GRANITE = Family("Granite", ("GraniteForCausalLM",), ("granite",), _granite, "granite.modeling_granite",
                 "GraniteRotaryEmbedding")
