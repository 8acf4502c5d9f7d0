"""Contiguous per-sequence KV cache: one slot per running sequence, grown on demand."""

from __future__ import annotations

import math

import torch

from flakecheck.errors import UserError


class KVCacheTooLarge(UserError):
    """The cache a workload needs exceeds what the GPU may give it (exit 2, saying how much it needs)."""


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, length: int = 256, device: str | torch.device = "cpu",
                 budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.shape = (num_slots, length, num_kv_heads, head_dim)
        self._check_budget(num_layers, self.shape, dtype)
        self.k = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.free_slots = list(range(num_slots - 1, -1, -1))

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    def _check_budget(self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        if self.budget_bytes is None:
            return
        needed = 2 * num_layers * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if needed > self.budget_bytes:
            slots, length = shape[0], shape[1]
            raise KVCacheTooLarge(
                f"the KV cache for {slots} sequences of up to {length} tokens needs {needed / (1 << 30):.2f} GiB, "
                f"but {self.budget_bytes / (1 << 30):.2f} GiB of the GPU are left for it after the weights: lower "
                "the batch (max_batch, --max-num-seqs) or --max-tokens, or raise --gpu-memory-utilization")

    @property
    def length(self) -> int:
        return self.shape[1]

    def ensure_length(self, needed: int) -> None:
        """Grow every slot to hold `needed` positions (rare: sized up front from the requests)."""
        if needed <= self.length:
            return
        new_len = max(needed, 2 * self.length)
        if self.budget_bytes is not None:
            self._check_budget(len(self.k), (self.shape[0], needed, *self.shape[2:]), self.k[0].dtype)
            new_len = max(needed, min(new_len, self._longest_in_budget()))
        grow = (self.shape[0], new_len - self.length, *self.shape[2:])
        self.k = [torch.cat((t, t.new_zeros(grow)), dim=1) for t in self.k]
        self.v = [torch.cat((t, t.new_zeros(grow)), dim=1) for t in self.v]
        self.shape = (self.shape[0], new_len, *self.shape[2:])

    def _longest_in_budget(self) -> int:
        assert self.budget_bytes is not None
        per_position = 2 * len(self.k) * self.shape[0] * math.prod(self.shape[2:]) * self.k[0].element_size()
        return self.budget_bytes // per_position

    def allocate(self) -> int:
        return self.free_slots.pop()

    def release(self, slot: int) -> None:
        self.free_slots.append(slot)

    def rows(self, slot: int, start: int, end: int) -> range:
        """Rows of positions start..end-1 of `slot` in a layer's cache viewed as [slots * length, ...]."""
        base = slot * self.length
        return range(base + start, base + end)

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, kv_heads, head_dim] at flat cache rows [T] (see `rows`)."""
        self.k[layer].view(-1, *self.shape[2:]).index_copy_(0, rows, k)
        self.v[layer].view(-1, *self.shape[2:]).index_copy_(0, rows, v)

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's keys and values at flat rows `src` copied to flat rows `dst` (see `rows`)."""
        for cache in (*self.k, *self.v):
            flat = cache.view(-1, *self.shape[2:])
            flat.index_copy_(0, dst, flat.index_select(0, src))

    def read(self, slot: int, start: int, end: int) -> torch.Tensor:
        """[layers, 2, end-start, kv_heads, head_dim] copy of one slot's keys and values."""
        return torch.stack([torch.stack((k[slot, start:end], v[slot, start:end])) for k, v in zip(self.k, self.v)])

    def load(self, slot: int, start: int, block: torch.Tensor) -> None:
        end = start + block.shape[2]
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            k[slot, start:end] = block[layer, 0]
            v[slot, start:end] = block[layer, 1]
