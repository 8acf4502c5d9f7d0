"""Phi-3 / Phi-4 as transformers configures them: fused qkv and gate_up weights, partial rotary (the RoPE tables
are as wide as the rotating dims), a sliding window on every layer where the config sets one. LongRoPE (the 128k
variants) recomputes its frequencies from the sequence length and is refused."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import Traits, activation_of, layer_windows
from flakecheck.engine.models.family import Family


def _phi3(hf: Any, source: str) -> Traits:
    return Traits(activation=activation_of(hf, source, ("silu",)), layer_windows=layer_windows(hf, every_layer=True))


PHI3 = Family("Phi-3 / Phi-4", ("Phi3ForCausalLM",), ("phi3",), _phi3, "phi3.modeling_phi3", "Phi3RotaryEmbedding")
