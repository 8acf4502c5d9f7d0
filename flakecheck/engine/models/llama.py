"""The Llama family as transformers configures it: Llama (Llama 3.1/3.2 RoPE scaling too), Mistral (a sliding window
on every layer), Qwen2 (qkv bias; windows per `layer_types`), Qwen3 (per-head q/k RMSNorm)."""

from __future__ import annotations

from typing import Any

from flakecheck.engine.model_config import HEAD, Traits, activation_of, layer_windows
from flakecheck.engine.models.family import Family

SILU = ("silu",)


def _llama(hf: Any, source: str) -> Traits:
    return Traits(activation=activation_of(hf, source, SILU), layer_windows=layer_windows(hf, every_layer=True))


def _qwen3(hf: Any, source: str) -> Traits:
    return Traits(activation=activation_of(hf, source, SILU), layer_windows=layer_windows(hf), qk_norm=HEAD)


ROPE = ("llama.modeling_llama", "LlamaRotaryEmbedding")
LLAMA = Family("Llama", ("LlamaForCausalLM",), ("llama",), _llama, *ROPE)
MISTRAL = Family("Mistral", ("MistralForCausalLM",), ("mistral",), _llama, *ROPE)
QWEN2 = Family("Qwen2 / Qwen2.5", ("Qwen2ForCausalLM",), ("qwen2",), _llama, *ROPE)
QWEN3 = Family("Qwen3", ("Qwen3ForCausalLM",), ("qwen3",), _qwen3, *ROPE)
