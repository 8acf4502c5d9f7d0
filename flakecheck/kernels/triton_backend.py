"""The Triton backend: every order of a plan as the Triton kernels of flakecheck/kernels/triton_kernels.py (on a
CUDA device, or on CPU under TRITON_INTERPRET=1 for tests on small shapes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flakecheck.kernels import triton_kernels as tk
from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.native import native_log_softmax, native_rmsnorm
from flakecheck.kernels.paths import FAST
from flakecheck.kernels.plan import BLOCKED, FIXED, NATIVE
from flakecheck.kernels.tensor_parallel import blocked_log_softmax
from flakecheck.kernels.torch_twins import short_sum
from flakecheck.kernels.weights import LinearWeights


@dataclass(frozen=True)
class TritonAttentionGroup:
    """Query rows whose sequences share a split size: their KV slots and how many keys each sees."""

    split_size: int
    rows: torch.Tensor | None  # packed rows (None: every row of the batch)
    row_slots: torch.Tensor
    row_limits: torch.Tensor
    row_firsts: torch.Tensor  # each row's first visible key (a sliding window's start; 0 without one)
    num_splits: int


class TritonBackend:
    name = "triton"
    # one kernel a primitive: the CPU paths (FBGEMM, MKL, fallbacks) the self-check chooses among are not Triton's
    paths = FAST
    interpreted = tk.INTERPRET  # TRITON_INTERPRET=1: numpy on the CPU, no tensor-core instruction to probe

    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None, orders: set[str]) -> LinearWeights:
        return LinearWeights(weight.detach().contiguous(), bias, None, None)  # the kernels read the weight itself

    def linear(self, x: torch.Tensor, w: LinearWeights, order: int) -> torch.Tensor:
        if order == NATIVE:
            return F.linear(x, w.weight, w.bias)
        if order == FIXED:
            return tk.matmul_persistent(x, w.weight, w.bias)
        return tk.matmul_splitk(x, w.weight, order, w.bias)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, order: int) -> torch.Tensor:
        if order == NATIVE:
            return native_rmsnorm(x, weight, eps)
        return tk.rmsnorm(x, weight, eps, splits=max(order, 0))

    def log_softmax(self, logits: torch.Tensor, order: int) -> torch.Tensor:
        if order == NATIVE:
            return native_log_softmax(logits)
        if order == BLOCKED:  # the tp-invariant order: torch's short row sums in fixed blocks, on any device
            return blocked_log_softmax(logits, short_sum)
        return tk.log_softmax(logits, splits=max(order, 0))

    def attention_meta(self, layout: AttentionLayout, group: int, device: torch.device) -> tuple[TritonAttentionGroup,
                                                                                                  ...]:
        assert layout.kv_splits is not None, "a plan assigns every sequence its KV split first"
        if any(s == NATIVE for s in layout.kv_splits):
            raise ValueError("the Triton backend has no native attention order")
        by_split: dict[int, list[int]] = {}
        for i, split in enumerate(layout.kv_splits):
            by_split.setdefault(split, []).append(i)
        groups = []
        for split, seqs in sorted(by_split.items()):
            rows, slots, limits, firsts = [], [], [], []
            for i in seqs:
                n, ctx = layout.query_len(i), layout.context_lens[i]
                rows += range(layout.query_starts[i], layout.query_starts[i + 1])
                slots += [layout.slots[i]] * n
                limits += range(ctx - n + 1, ctx + 1)
                firsts += (layout.first_key(p) for p in range(ctx - n, ctx))
            longest = max(layout.context_lens[i] for i in seqs)
            everyone = len(seqs) == layout.num_seqs
            groups.append(TritonAttentionGroup(
                split, None if everyone else torch.tensor(rows, device=device),
                torch.tensor(slots, dtype=torch.int32, device=device),
                torch.tensor(limits, dtype=torch.int32, device=device),
                torch.tensor(firsts, dtype=torch.int32, device=device), math.ceil(longest / split)))
        return tuple(groups)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: tuple[TritonAttentionGroup, ...], scale: float, softcap: float | None = None) -> torch.Tensor:
        out = torch.empty_like(q) if len(meta) > 1 or meta[0].rows is not None else None
        for g in meta:
            qg = q if g.rows is None else q.index_select(0, g.rows)
            m, l_, o = tk.attention_splits(qg, k_cache, v_cache, g.row_slots, g.row_limits, scale, g.split_size,
                                           g.num_splits, row_firsts=g.row_firsts, softcap=softcap)
            result = tk.combine_splits(m, l_, o, q.dtype)
            if out is None:
                return result
            out.index_copy_(0, g.rows, result) if g.rows is not None else out.copy_(result)
        assert out is not None
        return out
