"""The engine's view of a Hugging Face config: only the numbers the forward pass needs, and the traits in which
a family's decoder differs from Llama's (each family module under engine/models reads its own)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flakecheck.errors import ModelError

# RoPE types whose frequencies transformers recomputes from each call's sequence length: a table
# built once for all positions would not match them.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
PRE, SANDWICH, POST = "pre", "sandwich", "post"  # where a layer's norms sit around attention and the MLP
HEAD, PROJECTION = "head", "projection"  # q/k norms per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP as the family's config sets it (engine/layers/moe.py runs it)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # each routed expert's
    norm_topk_prob: bool  # the k chosen probabilities renormalised to sum to 1
    sparse_layers: tuple[bool, ...]  # per layer: routed experts, or the dense MLP of `intermediate_size`
    shared_intermediate_size: int = 0  # a shared expert beside the routed ones, sigmoid-gated (Qwen2-MoE); 0: none
    weights_fp32: bool = False  # expert outputs times the fp32 routing weights, rounded after (Mixtral)

    def shapes(self, hidden: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(N, K) of an expert's fused gate+up and of its down projection."""
        return (2 * self.intermediate_size, hidden), (hidden, self.intermediate_size)


@dataclass(frozen=True)
class Traits:
    """How a family's decoder departs from Llama's; every default is Llama's."""

    norms: str = PRE  # PRE: before attention and MLP; SANDWICH: before and after both (Gemma); POST: after (OLMo 2)
    norm_weight: str = "dtype"  # dtype: w scales the rounded values; fp32: w in fp32 before rounding; offset: 1 + w
    qk_norm: str | None = None  # HEAD or PROJECTION
    qkv_bias: bool = False
    mlp_bias: bool = False
    activation: str = "silu"  # a key of layers.activation.GATED_ACTIVATIONS
    embed_scale: float = 1.0  # embeddings times this (Gemma: sqrt(hidden), rounded to the model dtype first)
    embed_scale_in_dtype: bool = False
    residual_multiplier: float = 1.0  # Granite: each block's output scaled before the residual add
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma 2: scores capped by cap * tanh(s / cap)
    final_softcap: float | None = None  # Gemma 2: logits likewise
    logits_divisor: float = 1.0  # Granite's logits_scaling
    layer_windows: tuple[int | None, ...] = ()  # per layer: its sliding window, None for full attention
    layer_rope: tuple[str, ...] = ()  # per layer: which RoPE table it reads (Gemma 3: local and global bases)
    experts: Experts | None = None  # a mixture of experts: its routed MLP

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct sliding windows of the layers that have one."""
        return tuple(sorted({w for w in self.layer_windows if w is not None}))


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
    max_position_embeddings: int
    hf_config: Any
    traits: Traits = field(default_factory=Traits)

    @property
    def max_context(self) -> int:
        """Longest sequence the engine runs (sliding windows are computed, not a limit)."""
        return self.max_position_embeddings

    @property
    def qk_norm(self) -> bool:
        return self.traits.qk_norm is not None

    @classmethod
    def from_hf(cls, hf_config: Any, architecture: str, traits: Traits, source: str = "model") -> ModelConfig:
        """The numbers every family shares, read from `hf_config`; ModelError on what no family computes."""
        rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
        kinds = rope.values() if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]
        for params in kinds:
            rope_type = params.get("rope_type", params.get("type", "default"))
            if rope_type in LENGTH_DEPENDENT_ROPE:
                raise ModelError(f"{source}: RoPE type {rope_type!r} depends on the sequence length and is not "
                                 "supported")
        heads = hf_config.num_attention_heads
        return cls(
            architecture=architecture,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            vocab_size=hf_config.vocab_size,
            rms_norm_eps=hf_config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            max_position_embeddings=getattr(hf_config, "max_position_embeddings", 2048),
            hf_config=hf_config,
            traits=traits,
        )


def activation_of(hf_config: Any, source: str, supported: tuple[str, ...]) -> str:
    """The config's gated activation (hidden_act, or Gemma's hidden_activation); ModelError if unsupported."""
    act = getattr(hf_config, "hidden_activation", None) or getattr(hf_config, "hidden_act", "silu")
    if act not in supported:
        raise ModelError(f"{source}: hidden activation {act!r} is not supported (supported: {', '.join(supported)})")
    return str(act)


def layer_windows(hf_config: Any, every_layer: bool = False) -> tuple[int | None, ...]:
    """Each layer's sliding window: from `layer_types` where the config has them (Qwen2, Qwen3, Gemma), else the
    config's `sliding_window` on every layer (Mistral, Phi-3) when `every_layer`."""
    n = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    types = getattr(hf_config, "layer_types", None)
    if not window:
        return (None,) * n
    if types is not None:
        return tuple(int(window) if t == "sliding_attention" else None for t in types)
    if not every_layer or getattr(hf_config, "use_sliding_window", True) is False:
        return (None,) * n
    return (int(window),) * n
