"""Contiguous per-sequence KV cache: one slot per running sequence, grown on demand."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, length: int = 256) -> None:
        self.shape = (num_slots, length, num_kv_heads, head_dim)
        self.k = [torch.zeros(self.shape, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(self.shape, dtype=dtype) for _ in range(num_layers)]
        self.free_slots = list(range(num_slots - 1, -1, -1))

    @property
    def length(self) -> int:
        return self.shape[1]

    def ensure_length(self, needed: int) -> None:
        """Grow every slot to hold `needed` positions (rare: sized up front from the requests)."""
        if needed <= self.length:
            return
        new_len = max(needed, 2 * self.length)
        grow = (self.shape[0], new_len - self.length, *self.shape[2:])
        self.k = [torch.cat((t, t.new_zeros(grow)), dim=1) for t in self.k]
        self.v = [torch.cat((t, t.new_zeros(grow)), dim=1) for t in self.v]
        self.shape = (self.shape[0], new_len, *self.shape[2:])

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
