"""The registry: a Hugging Face architecture -> its family (one file a family), and the model class it builds
behind the model interface (engine/models/interface.py): the dense decoder (engine/models/decoder.py), or the
mixture of experts (engine/models/moe.py) for a family whose traits carry routed experts."""

from __future__ import annotations

from typing import Any

import torch

from flakecheck.engine.model_config import ModelConfig
from flakecheck.engine.models.decoder import DecoderLM
from flakecheck.engine.models.family import Family
from flakecheck.engine.models.gemma import GEMMA2, GEMMA3
from flakecheck.engine.models.granite import GRANITE
from flakecheck.engine.models.interface import CausalLM
from flakecheck.engine.models.llama import LLAMA, MISTRAL, QWEN2, QWEN3
from flakecheck.engine.models.mixtral import MIXTRAL
from flakecheck.engine.models.moe import MoeLM
from flakecheck.engine.models.olmo2 import OLMO2
from flakecheck.engine.models.olmoe import OLMOE
from flakecheck.engine.models.phi3 import PHI3
from flakecheck.engine.models.qwen_moe import QWEN2_MOE, QWEN3_MOE
from flakecheck.engine.models.shapes import model_dims, probe_dims, sharded_dims
from flakecheck.errors import ModelError
from flakecheck.kernels import Ops

FAMILIES: tuple[Family, ...] = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA2, GEMMA3, PHI3, OLMO2, GRANITE, MIXTRAL, QWEN2_MOE,
                                QWEN3_MOE, OLMOE)
ARCHITECTURES = {arch: family for family in FAMILIES for arch in family.architectures}
MODEL_TYPES = {model_type: family for family in FAMILIES for model_type in family.model_types}
# what a known architecture still needs before it can run here (the refusal says it)
MISSING = {
    "GptOss": "its attention sinks and biased router (mixture-of-experts runs for Mixtral, Qwen2/3-MoE, OLMoE)",
    "Deepseek": "its latent attention and grouped routing (mixture-of-experts runs for Mixtral, Qwen2/3-MoE, OLMoE)",
    "MoE": "its mixture-of-experts layers (routed experts run for Mixtral, Qwen2/3-MoE and OLMoE only)",
    "ConditionalGeneration": "its vision or audio tower (only text decoders run here)",
}


def family_of(hf_config: Any, source: str = "model") -> tuple[str, Family]:
    """The config's architecture and family; ModelError naming the architecture, what it lacks, and the
    supported ones."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch, ARCHITECTURES[arch]
    model_type = getattr(hf_config, "model_type", "")
    if not archs and model_type in MODEL_TYPES:
        family = MODEL_TYPES[model_type]
        return family.architectures[0], family
    found = ", ".join(archs) or f"model_type={model_type!r}"
    missing = next((why for key, why in MISSING.items() if key.lower() in found.lower()),
                   "no implementation in flakecheck's engine")
    raise ModelError(f"{source}: unsupported architecture {found} ({missing}); supported: "
                     f"{', '.join(ARCHITECTURES)}")


def read_config(hf_config: Any, source: str = "model") -> ModelConfig:
    """The engine's view of a Hugging Face config, with its family's traits."""
    arch, family = family_of(hf_config, source)
    return ModelConfig.from_hf(hf_config, arch, family.traits(hf_config, source), source)


def build_model(config: ModelConfig, weights: dict[str, torch.Tensor], ops: Ops, max_len: int) -> CausalLM:
    """The model's layers over the loaded weights, with what `ops`' policy derives from them."""
    model = MoeLM if config.traits.experts is not None else DecoderLM
    return model(config, weights, ops, max_len, ARCHITECTURES[config.architecture].rotary)


__all__ = ["ARCHITECTURES", "FAMILIES", "CausalLM", "build_model", "family_of", "model_dims", "probe_dims",
           "read_config", "sharded_dims"]
