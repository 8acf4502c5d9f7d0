"""The inference core: a nano-vllm-style continuous-batching engine over a kernel policy."""

from flakecheck.engine.engine_core import EngineCore, Request
from flakecheck.engine.llm_engine import Knobs, LLMEngine, build_model, decode_tokens, encode_prompt, token_texts
from flakecheck.engine.loader import DEFAULT_MODEL, LoadedModel, load_model
from flakecheck.engine.sequence import Completion, SamplingParams

__all__ = [
    "DEFAULT_MODEL", "Completion", "EngineCore", "Knobs", "LLMEngine", "LoadedModel", "Request", "SamplingParams",
    "build_model", "decode_tokens", "encode_prompt", "load_model", "token_texts",
]
