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
    def __init__(self, weight: torch.Tensor) -> None:
        # vocab-parallel too in a TP server, but exactly so: one rank holds each row, the others add zeros
        self.weight = weight

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)


class LMHead:
    """Logits in the activation dtype through the policy's matmul, then its fp32 log-softmax; under tensor
    parallelism each rank owns a slice of the vocabulary (`sharding`) and the log-softmax combines the
    slices' maxima and sums."""

    def __init__(self, ops: Ops, weight: torch.Tensor, sharding: Sharding | None = None) -> None:
        self.ops, self.proj = ops, Linear(ops, weight, sharding=sharding)

    def __call__(self, hidden: torch.Tensor, layout: BatchLayout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits in the activation dtype, fp32 log-probabilities) of the sampling rows."""
        if layout is None:
            logits = self.ops.linear(hidden, self.proj.weights)
            return logits, self.ops.log_softmax(logits)
        logits = self.proj.run(hidden, layout.sharded_lm_head())
        final = layout.sharded_final()
        if all(key.tp == 1 for key, _ in final):
            return logits, self.ops.log_softmax(logits, tuple((key.order, rows) for key, rows in final))
        return logits, by_groups(logits, final, self._log_softmax, dtype=torch.float32)  # type: ignore[arg-type]

    def _log_softmax(self, logits: torch.Tensor, key: ShardOrder) -> torch.Tensor:
        if key.tp == 1 or key.order == BLOCKED:  # the blocked order is the same at every TP size
            return self.ops.log_softmax(logits, ((key.order, slice(None)),))
        return vocab_parallel_log_softmax(logits, key.tp, lambda values: split_short_sum(values, key.order))
