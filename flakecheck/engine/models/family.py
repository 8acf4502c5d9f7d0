"""A model family: the architectures it covers, its traits read from a config, and its own RoPE module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flakecheck.engine.model_config import Traits

TraitsOf = Callable[[Any, str], Traits]  # (hf_config, source) -> the family's traits; ModelError if unsupported


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    traits: TraitsOf
    rotary_module: str  # transformers' modeling module of the family, whose RoPE class the engine's tables come from
    rotary_class: str

    def rotary(self, hf_config: Any) -> Any:
        """The family's own transformers RoPE module (frequencies, scaling and attention factor as it computes
        them), imported where a model is built: transformers takes seconds to import."""
        module = importlib.import_module(f"transformers.models.{self.rotary_module}")
        return getattr(module, self.rotary_class)(hf_config)
