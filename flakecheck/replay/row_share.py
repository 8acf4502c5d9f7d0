"""Rows shared beyond one lockstep: a store of computed rows that outlives the sequences that computed them.

Within a lockstep a row is computed once for every sequence whose row has the same lineage digest (its token,
its position, the digest of the rows before it, and the body of its step's plan — so the whole history of plans
that wrote its keys and values; flakecheck/replay/shared_rows.py), as long as a sequence that holds it still
runs. A sequence's cache slot goes to another once it finishes, and `run --sample auto` replays its rounds as
separate locksteps, so a row computed there is computed again when a later draw or round needs it. The store
keeps a copy of every computed row's keys and values (every layer, one position) and every sampled token, by
digest, for the whole run: a row whose digest is there is loaded into the slot that needs it instead of computed.
The digest covers everything a row's bits follow from, so the loaded row is the computed one bit for bit
(tests/test_row_share.py replays the same draws with and without the store and compares every token and
logprob).

The store is opt-in and scoped: `with RowStore.active(store): ...` makes every lockstep built inside it use
`store`; outside, `RowStore.current()` is None and replay is what it was (`run --sample auto` opens one for its
rounds). It keeps at most `max_bytes` of rows, 1 GiB by default (what it cannot keep is computed again when
needed): `RowStore.capacity(0)` turns it off, for a side-by-side measurement.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from flakecheck.engine.engine_core import Sampled
from flakecheck.engine.kv_cache import KVCache

# what a store may hold: about 23 KB a row for SmolLM2-135M in bf16 (30 layers, 3 KV heads of 64), ~46,000 rows
DEFAULT_MAX_BYTES = 1 << 30

_ACTIVE: ContextVar[RowStore | None] = ContextVar("flakecheck_row_store", default=None)
# how many bytes of rows a run's store keeps (`RowStore.for_run`); 0 turns sharing beyond a lockstep off
_CAPACITY: ContextVar[int] = ContextVar("flakecheck_row_store_bytes", default=DEFAULT_MAX_BYTES)


@dataclass(frozen=True)
class Stored:
    """A row whose keys and values are in the store (its digest)."""

    digest: bytes


@dataclass
class StoreStats:
    stored: int = 0  # rows copied into the store
    loaded: int = 0  # rows a step took from the store instead of computing them
    sampled: int = 0  # sampled tokens a step took from the store (a row's token under the same LM head orders)
    full: int = 0  # computed rows the store had no room for


class RowStore:
    """Computed rows' keys and values and sampled tokens, by lineage digest, across locksteps."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_rows: int | None = None) -> None:
        self.max_bytes, self.max_rows = max_bytes, max_rows
        self.rows: dict[bytes, torch.Tensor] = {}  # digest -> [layers, 2, kv_heads, head_dim]
        self.sampled: dict[tuple[bytes, int, int], Sampled] = {}
        # the numbering of plan bodies that digests are made of: the same for every lockstep, or digests of
        # different locksteps would not compare
        self.plans: dict[tuple[object, ...], bytes] = {}
        self.stats = StoreStats()

    @staticmethod
    def for_run() -> RowStore:
        """A store for one run's locksteps, of the capacity in force (`capacity`)."""
        return RowStore(_CAPACITY.get())

    @staticmethod
    @contextmanager
    def capacity(max_bytes: int) -> Iterator[None]:
        """Stores made inside (`for_run`) keep at most `max_bytes` of rows (0: none, every row computed)."""
        token = _CAPACITY.set(max_bytes)
        try:
            yield
        finally:
            _CAPACITY.reset(token)

    @staticmethod
    def current() -> RowStore | None:
        return _ACTIVE.get()

    @staticmethod
    @contextmanager
    def active(store: RowStore | None) -> Iterator[RowStore | None]:
        """Every lockstep built inside uses `store` (None: none)."""
        token = _ACTIVE.set(store)
        try:
            yield store
        finally:
            _ACTIVE.reset(token)

    def has(self, digest: bytes) -> bool:
        return digest in self.rows

    def keep(self, cache: KVCache, slot: int, start: int, digests: list[bytes]) -> None:
        """Copy the rows `digests` name (at `slot`, from `start`, just computed) into the store."""
        new = [i for i, d in enumerate(digests) if d not in self.rows]
        if not new:
            return
        row_bytes = cache.k[0][0, 0].numel() * cache.k[0].element_size() * 2 * len(cache.k)
        limit = self.max_bytes // row_bytes
        if self.max_rows is not None:
            limit = min(limit, self.max_rows)
        room = limit - len(self.rows)
        if room < len(new):
            self.stats.full += len(new) - max(room, 0)
            new = new[:max(room, 0)]
            if not new:
                return
        lo, hi = new[0], new[-1] + 1
        block = cache.read(slot, start + lo, start + hi).cpu()  # [layers, 2, rows, kv_heads, head_dim]
        for i in new:
            self.rows[digests[i]] = block[:, :, i - lo].clone()
        self.stats.stored += len(new)

    def load(self, cache: KVCache, loads: list[tuple[bytes, int, int]]) -> None:
        """Write stored rows into cache slots: (digest, slot, position) each."""
        if not loads:
            return
        block = torch.stack([self.rows[d] for d, _, _ in loads], dim=2).to(cache.device)
        flat = torch.tensor([slot * cache.length + position for _, slot, position in loads], device=cache.device)
        for layer, (k, v) in enumerate(zip(cache.k, cache.v)):
            k.view(-1, *cache.shape[2:]).index_copy_(0, flat, block[layer, 0])
            v.view(-1, *cache.shape[2:]).index_copy_(0, flat, block[layer, 1])
        self.stats.loaded += len(loads)
