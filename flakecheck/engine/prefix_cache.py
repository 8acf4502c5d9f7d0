"""Prefix cache keyed by token blocks: a prompt that starts with cached blocks skips their prefill."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16


def block_hashes(token_ids: list[int], block_size: int = BLOCK_SIZE, salt: str | None = None) -> list[int]:
    """Chained hash of every full block: a block's key covers all the tokens before it too, and the
    request's cache salt, so requests with different salts never share a block."""
    hashes, parent = [], 0 if salt is None else hash(("cache_salt", salt))
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class CachedBlock:
    """One block's keys and values [layers, 2, block, kv_heads, head_dim], the lineage digest of its last
    position (what they are the result of) and of the position before it (the keys and values they were
    computed on); None when the writer did not track them."""

    kv: torch.Tensor
    lineage: bytes | None = None
    parent: bytes | None = None


class PrefixCache:
    def __init__(self, capacity_blocks: int = 4096, block_size: int = BLOCK_SIZE) -> None:
        self.blocks: OrderedDict[int, CachedBlock] = OrderedDict()
        self.capacity, self.block_size = capacity_blocks, block_size

    def lookup(self, prompt_ids: list[int], salt: str | None = None) -> list[CachedBlock]:
        """Cached KV blocks for the longest cached prefix, leaving at least one prompt token to compute."""
        usable = block_hashes(prompt_ids[:-1], self.block_size, salt)
        found = []
        for key in usable:
            block = self.blocks.get(key)
            if block is None:
                break
            self.blocks.move_to_end(key)
            found.append(block)
        return found

    def missing(self, prompt_ids: list[int], salt: str | None = None) -> list[tuple[int, int]]:
        """(block index, hash) of the prompt's full blocks not cached yet."""
        hashes = block_hashes(prompt_ids, self.block_size, salt)
        return [(i, key) for i, key in enumerate(hashes) if key not in self.blocks]

    def insert(self, key: int, block: CachedBlock) -> None:
        self.blocks[key] = block
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
