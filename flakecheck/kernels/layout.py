"""Where a physical batch's rows are, and which plan each follows.

A physical forward pass packs the rows of one or more (virtual) steps, each with its own StepPlan:
one step when a composition is replayed alone, many when compositions are simulated together.
`BatchLayout` turns the segments into row groups per op (rows that share an order are reduced in
one call), once per forward pass; `AttentionLayout` says where each sequence's query rows are, what
they attend to, and which sequences decode (one row) or prefill — computed once here for every
backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from flakecheck.kernels.plan import StepPlan

Rows = slice | torch.Tensor  # a contiguous range of rows, or row indices
Groups = tuple[tuple[int, Rows], ...]  # (order, rows that follow it), one entry per order


class ShardOrder(NamedTuple):
    """What a sharded op's rows follow: the step's TP size and all-reduce, and each shard's order."""

    tp: int
    allreduce: str
    order: int


ShardedGroups = tuple[tuple[ShardOrder, Rows], ...]  # one entry per (TP size, all-reduce, order)


@dataclass(frozen=True)
class Segment:
    """One step's part of a physical batch: packed rows lo:hi, sampling rows lo:hi (positions among
    the batch's sampling rows), sequences lo:hi, and the plan of that step."""

    rows: tuple[int, int]
    samples: tuple[int, int]
    seqs: tuple[int, int]
    plan: StepPlan


def group_rows(spans: Sequence[tuple[Any, int, int]], total: int) -> tuple[tuple[Any, Rows], ...]:
    """(order, lo, hi) spans -> one entry per order; a single contiguous run stays a slice."""
    by_order: dict[Any, list[tuple[int, int]]] = {}
    for order, lo, hi in spans:
        if hi > lo:
            by_order.setdefault(order, []).append((lo, hi))
    groups = []
    for order in sorted(by_order):
        runs = _merge(by_order[order])
        if len(runs) == 1:
            lo, hi = runs[0]
            groups.append((order, slice(0, total) if (lo, hi) == (0, total) else slice(lo, hi)))
        else:
            groups.append((order, torch.cat([torch.arange(lo, hi) for lo, hi in runs])))
    return tuple(groups)


def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(runs):
        if merged and merged[-1][1] == lo:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


class BatchLayout:
    """Row groups per op of one physical batch (built on first use, then shared by every layer)."""

    def __init__(self, segments: Sequence[Segment], num_rows: int, num_sample_rows: int) -> None:
        self.segments, self.num_rows, self.num_sample_rows = tuple(segments), num_rows, num_sample_rows
        self._memo: dict[tuple[str, int, int], Any] = {}

    def _groups(self, key: tuple[str, int, int], order_of: Callable[[StepPlan], Any], sampling: bool,
                rows_per_token: int = 1) -> Any:
        if key not in self._memo:
            spans = [(order_of(s.plan), (s.samples if sampling else s.rows)[0] * rows_per_token,
                      (s.samples if sampling else s.rows)[1] * rows_per_token) for s in self.segments]
            total = (self.num_sample_rows if sampling else self.num_rows) * rows_per_token
            self._memo[key] = group_rows(spans, total)
        return self._memo[key]

    def projection(self, n: int, k: int) -> Groups:
        return self._groups(("projection", n, k), lambda p: p.projection(n, k), sampling=False)

    def norm(self, rows_per_token: int) -> Groups:
        return self._groups(("norm", rows_per_token, 0), lambda p: p.norm(rows_per_token), sampling=False,
                            rows_per_token=rows_per_token)

    def lm_head(self) -> Groups:
        return self._groups(("lm_head", 0, 0), lambda p: p.lm_head, sampling=True)

    def final(self) -> Groups:
        return self._groups(("final", 0, 0), lambda p: p.final, sampling=True)

    def sharded(self, n: int, k: int) -> ShardedGroups:
        """A projection's rows by their step's TP size, all-reduce and shard order."""
        return self._groups(("sharded", n, k), lambda p: ShardOrder(p.tp.size, p.tp.allreduce, p.projection(n, k)),
                            sampling=False)

    def sharded_lm_head(self) -> ShardedGroups:
        return self._groups(("sharded_lm_head", 0, 0), lambda p: ShardOrder(p.tp.size, p.tp.allreduce, p.lm_head),
                            sampling=True)

    def sharded_final(self) -> ShardedGroups:
        """The log-softmax's rows by their step's TP size (its vocabulary shards) and order."""
        return self._groups(("sharded_final", 0, 0), lambda p: ShardOrder(p.tp.size, p.tp.allreduce, p.final),
                            sampling=True)

    def routed(self, rows: torch.Tensor, n: int, k: int) -> Groups:
        """An expert's (N, K) matmul over the batch rows routed to it (`rows`: their indices, ascending), as
        groups of positions in that gathered input: each step's rows take the order its plan's expert rule gives
        the number of that step's rows routed to the expert — a row's order follows its own step's routing
        alone, however many steps share the forward pass."""
        bounds = torch.searchsorted(rows, torch.tensor([b for s in self.segments for b in s.rows], device=rows.device))
        spans = []
        for i, segment in enumerate(self.segments):
            lo, hi = int(bounds[2 * i]), int(bounds[2 * i + 1])
            if segment.plan.experts is None:
                raise ValueError("the step plan has no rule for routed experts (a dense model's plan)")
            spans.append((segment.plan.experts.order(hi - lo, n, k), lo, hi))
        return group_rows(spans, rows.shape[0])


@dataclass
class AttentionLayout:
    """Sequence i owns packed rows `query_starts[i]:query_starts[i+1]`, whose positions are
    `context_lens[i] - n_new .. context_lens[i] - 1`; its keys live in KV-cache slot `slots[i]`
    rows `0:context_lens[i]`, already written when attention runs, reduced `kv_splits[i]` keys a
    split (None until a plan assigns them). With a sliding `window`, a query at position p sees only keys
    p - window + 1 .. p (as transformers masks them); splits still count keys from the sequence's start, so a
    row's reduction order depends on its own position alone."""

    slots: list[int]
    query_starts: list[int]
    context_lens: list[int]
    kv_splits: list[int] | None = None
    window: int | None = None
    slots_t: torch.Tensor = field(init=False, repr=False)
    context_lens_t: torch.Tensor = field(init=False, repr=False)
    decode: list[int] = field(init=False)  # sequences with one query row this step
    prefill: list[int] = field(init=False)  # sequences with several (a prompt or a chunk of one)

    def __post_init__(self) -> None:
        self.slots_t = torch.tensor(self.slots)
        self.context_lens_t = torch.tensor(self.context_lens)
        self.decode = [i for i in range(self.num_seqs) if self.query_len(i) == 1]
        self.prefill = [i for i in range(self.num_seqs) if self.query_len(i) > 1]

    @classmethod
    def of(cls, seqs: Sequence[tuple[int, int, int]], kv_splits: list[int] | None = None,
           window: int | None = None) -> AttentionLayout:
        """From (slot, new rows, context length) per sequence, packed in that order."""
        starts = [0]
        for _, n, _ in seqs:
            starts.append(starts[-1] + n)
        return cls([s for s, _, _ in seqs], starts, [c for _, _, c in seqs], kv_splits, window)

    def first_key(self, position: int) -> int:
        """The first key a query at `position` sees."""
        return 0 if self.window is None else max(0, position - self.window + 1)

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    def query_len(self, i: int) -> int:
        return self.query_starts[i + 1] - self.query_starts[i]
