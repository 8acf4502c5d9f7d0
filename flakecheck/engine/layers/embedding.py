from __future__ import annotations

import torch
import torch.nn.functional as F

from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.parallel import Sharding
from flakecheck.kernels import BatchLayout, Ops
from flakecheck.kernels.layout import ShardOrder
from flakecheck.kernels.ops import by_groups
from flakecheck.kernels.plan import BLOCKED
from flakecheck.kernels.tensor_parallel import vocab_parallel_log_softmax
from flakecheck.kernels.torch_twins import split_short_sum


class Embedding:
    """Token embeddings, times the family's `scale` (Gemma's sqrt(hidden), rounded to the model dtype first when
    `scale_in_dtype`, as transformers does; Granite's embedding multiplier)."""

    def __init__(self, weight: torch.Tensor, scale: float = 1.0, scale_in_dtype: bool = False) -> None:
        # vocab-parallel too in a TP server, but exactly so: one rank holds each row, the others add zeros
        self.weight = weight
        self.scale: float | torch.Tensor | None = None if scale == 1.0 else scale
        if self.scale is not None and scale_in_dtype:
            self.scale = torch.tensor(scale, dtype=weight.dtype, device=weight.device)

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        hidden = F.embedding(token_ids, self.weight)
        return hidden if self.scale is None else hidden * self.scale


class LMHead:
    """Logits in the activation dtype through the policy's matmul (then, elementwise, the family's soft cap or
    divisor), then its fp32 log-softmax; under tensor parallelism each rank owns a slice of the vocabulary
    (`sharding`) and the log-softmax combines the slices' maxima and sums."""

    def __init__(self, ops: Ops, weight: torch.Tensor, sharding: Sharding | None = None,
                 softcap: float | None = None, divisor: float = 1.0) -> None:
        self.ops, self.proj = ops, Linear(ops, weight, sharding=sharding)
        self.softcap, self.divisor = softcap, divisor

    def _shaped(self, logits: torch.Tensor) -> torch.Tensor:
        """As transformers computes them, in the activation dtype: Granite's logits / logits_scaling, Gemma 2's
        cap * tanh(logits / cap)."""
        if self.divisor != 1.0:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def __call__(self, hidden: torch.Tensor, layout: BatchLayout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits in the activation dtype, fp32 log-probabilities) of the sampling rows."""
        if layout is None:
            logits = self._shaped(self.ops.linear(hidden, self.proj.weights))
            return logits, self.ops.log_softmax(logits)
        logits = self._shaped(self.proj.run(hidden, layout.sharded_lm_head()))
        final = layout.sharded_final()
        if all(key.tp == 1 for key, _ in final):
            return logits, self.ops.log_softmax(logits, tuple((key.order, rows) for key, rows in final))
        return logits, by_groups(logits, final, self._log_softmax, dtype=torch.float32)  # type: ignore[arg-type]

    def _log_softmax(self, logits: torch.Tensor, key: ShardOrder) -> torch.Tensor:
        if key.tp == 1 or key.order == BLOCKED:  # the blocked order is the same at every TP size
            return self.ops.log_softmax(logits, ((key.order, slice(None)),))
        return vocab_parallel_log_softmax(logits, key.tp, lambda values: split_short_sum(values, key.order))
