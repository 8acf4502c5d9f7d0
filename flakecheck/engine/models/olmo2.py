"""OLMo 2 as transformers configures it: no norm before attention or the MLP, one after each (weight applied in
fp32 before rounding), q/k RMSNorm over the whole projection rather than per head."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import POST, PROJECTION, Traits, activation_of
from flakecheck.engine.models.family import Family


def _olmo2(hf: Any, source: str) -> Traits:
    return Traits(norms=POST, norm_weight="fp32", qk_norm=PROJECTION, activation=activation_of(hf, source, ("silu",)))


OLMO2 = Family("OLMo 2", ("Olmo2ForCausalLM",), ("olmo2",), _olmo2, "olmo2.modeling_olmo2", "Olmo2RotaryEmbedding")
