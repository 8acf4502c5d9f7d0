"""Gemma 2 and Gemma 3 as transformers configures them: norms before and after attention and the MLP with a
`1 + w` weight in fp32, GELU-tanh MLP, embeddings scaled by sqrt(hidden), attention scaled by
query_pre_attn_scalar, alternating sliding-window layers; Gemma 2 soft-caps attention scores and logits; Gemma 3
adds per-head q/k norms and gives its local and global layers their own RoPE bases."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import HEAD, SANDWICH, Traits, activation_of, layer_windows
from flakecheck.engine.models.family import Family

GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def _gemma2(hf: Any, source: str) -> Traits:
    return Traits(
        norms=SANDWICH, norm_weight="offset", activation=activation_of(hf, source, GELU_TANH),
        embed_scale=hf.hidden_size**0.5, embed_scale_in_dtype=True,
        attention_scale=hf.query_pre_attn_scalar**-0.5, attn_softcap=getattr(hf, "attn_logit_softcapping", None),
        final_softcap=getattr(hf, "final_logit_softcapping", None), layer_windows=layer_windows(hf),
    )


def _gemma3(hf: Any, source: str) -> Traits:
    base = _gemma2(hf, source)
    return Traits(**{**base.__dict__, "qk_norm": HEAD, "layer_rope": tuple(hf.layer_types)})


GEMMA2 = Family("Gemma 2", ("Gemma2ForCausalLM",), ("gemma2",), _gemma2, "gemma2.modeling_gemma2",
                "Gemma2RotaryEmbedding")
GEMMA3 = Family("Gemma 3", ("Gemma3ForCausalLM",), ("gemma3_text",), _gemma3, "gemma3.modeling_gemma3",
                "Gemma3RotaryEmbedding")
