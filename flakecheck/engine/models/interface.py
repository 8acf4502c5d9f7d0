"""The one model interface: what the engine, replay, explain, the self-check and the TP check read of a model."""

from __future__ import annotations

from typing import Protocol

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.model_config import ModelConfig
from flakecheck.kernels import ModelDims, Ops


class CausalLM(Protocol):
    config: ModelConfig
    ops: Ops  # the kernel policy on its backend, through which every reduction of the model runs
    dims: ModelDims  # the reduction shapes a step plan covers (and how tensor parallelism shards them)
    group: int  # query heads per KV head

    def forward(self, batch: ForwardBatch, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (model dtype) and log-probabilities (fp32) [rows, vocab] at every sampling row of the batch."""
        ...
