"""One file a model family; the registry maps a Hugging Face architecture to its class."""

from flakecheck.engine.models.llama import LlamaForCausalLM

MODEL_CLASSES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,  # + qkv bias, set from the config
    "Qwen3ForCausalLM": LlamaForCausalLM,  # + per-head q/k RMSNorm, set from the config
}

__all__ = ["MODEL_CLASSES", "LlamaForCausalLM"]
