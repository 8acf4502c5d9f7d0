"""The engine's view of a Hugging Face config: only the numbers the forward pass needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakecheck.errors import ModelError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# RoPE types whose frequencies transformers recomputes from each call's sequence length: a table
# built once for all positions would not match them.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    hf_config: Any
    mlp_bias: bool = False
    sliding_window: int | None = None  # attention window of the layers that have one

    @property
    def max_context(self) -> int:
        """Longest sequence the engine runs. Up to its window, sliding-window attention sees every
        earlier token, so it equals full attention; past it the engine refuses instead of implementing
        the window in every kernel policy."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    @classmethod
    def from_hf(cls, hf_config: Any, source: str = "model") -> ModelConfig:
        archs = list(getattr(hf_config, "architectures", None) or [])
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            arch = _architecture_from_model_type(getattr(hf_config, "model_type", ""))
        if arch is None:
            found = ", ".join(archs) or f"model_type={getattr(hf_config, 'model_type', '?')!r}"
            raise ModelError(
                f"{source}: unsupported architecture {found}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise ModelError(f"{source}: hidden_act {act!r} is not supported (only silu)")
        rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type in LENGTH_DEPENDENT_ROPE:
            raise ModelError(f"{source}: RoPE type {rope_type!r} depends on the sequence length and is not supported")
        heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        return cls(
            architecture=arch,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            vocab_size=hf_config.vocab_size,
            rms_norm_eps=hf_config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(getattr(hf_config, "attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            max_position_embeddings=getattr(hf_config, "max_position_embeddings", 2048),
            hf_config=hf_config,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            sliding_window=_sliding_window(hf_config),
        )


def _architecture_from_model_type(model_type: str) -> str | None:
    return {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }.get(model_type)


def _sliding_window(hf_config: Any) -> int | None:
    """The window, if any layer uses one: Mistral applies `sliding_window` to every layer when set;
    Qwen2/Qwen3 mark the windowed layers in `layer_types` (from use_sliding_window/max_window_layers)."""
    window = getattr(hf_config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return int(window)
