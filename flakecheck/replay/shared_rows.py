"""Which rows a simulated forward pass computes: rows that are the same computation only once.

Under row-invariant kernels a row's keys, values and logits follow from its token, its position, the
keys and values before it in its own sequence, and its step's plan, and from nothing else in the
batch. Every computed position gets a digest of exactly that — chained, so the previous position's
digest stands for all the keys and values before it — kept in `Sequence.lineage` (and with a prefix
cache's blocks). Rows with equal digests are the same computation bit for bit: `solo` and a `prefix`
request that finds nothing cached prefill the same prompt under the same plans; two requests that
share a system prompt prefill its rows identically whenever their steps pick the same plans. Such a
row is computed once: a pass's first occurrence writes its keys and values into every sequence that
needs them, and a row an earlier pass already computed is copied from a sequence that still holds it in
its cache slot (the one that computed it, or one that was handed it). The LM head and final norm orders
do not enter a row's digest (they shape only what a sampling row samples): a sampling row reuses a token
sampled from the same row under the same two orders, or samples again from the row this pass computes.

A filler of fixed length (nothing reads what it generates) is scheduled — its rows count in its steps'
shapes, hence in their plans — but not computed: no other row reads them. Under a prefix cache the prompt
blocks a case could load from it are the exception (`Sequence.shape_from`): those are computed.

Only the leading rows of a sequence's step are shared (a sequence's computed rows stay one run of
positions, as the attention layout wants), and only under kernels whose rows are batch-invariant
(simulated replay). A mixture of experts under split-K is not: an expert's matmul order follows how many of
the step's rows the router sent it, so every row of such a step (a filler's too) is computed in its step.
A digest is 128 bits of BLAKE2b: a collision is not a practical concern.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from flakecheck.engine.engine_core import Sampled
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.model_runner import BatchBuilder, PlannedStep
from flakecheck.engine.sequence import SeqStatus, Sequence
from flakecheck.kernels import StepPlan
from flakecheck.replay.row_share import RowStore, Stored

# what a shape-only sequence "samples": nothing reads it, and its length does not depend on it
UNREAD = Sampled(0, 0, math.nan, math.nan, math.nan)


@dataclass(frozen=True)
class Source:
    """Where a computed row's keys and values are: `seq`'s cache slot at `position`."""

    seq: Sequence
    position: int

    @property
    def valid(self) -> bool:
        """Whether they are still there (a finished sequence's slot goes to another)."""
        return self.seq.status is SeqStatus.RUNNING


@dataclass
class SeqRows:
    """One sequence of a step in a pass: its rows' digests; for each leading row it does not compute, where
    that row's results are (a packed row of the pass, or an earlier computation); where its sampled token
    comes from (a packed row of the pass, or an earlier computation)."""

    seq: Sequence
    start: int
    n: int
    digests: list[bytes]  # of the rows it computes: the first of its n, or none (Sequence.shape_from)
    sources: list[int | Source | Stored] = field(default_factory=list)
    sample_row: int | None = None
    reused: Sampled | None = None
    keep: bool = True  # whether a run's row store may keep its computed rows (not when its digests are random)

    @property
    def samples(self) -> bool:
        return self.start + self.n == len(self.seq.token_ids)


@dataclass
class SharedPass:
    """One forward pass being packed: its steps, the rows it computes, and the copies made before it."""

    builder: BatchBuilder
    steps: list[tuple[PlannedStep, list[SeqRows]]] = field(default_factory=list)
    rows: dict[bytes, int] = field(default_factory=dict)  # digest -> packed row computing it
    shared: int = 0  # rows of its steps that it takes from another sequence's identical row
    skipped: int = 0  # rows past a sequence's shape_from: scheduled, never computed
    copies: list[tuple[int, int]] = field(default_factory=list)  # (cache row, cache row), before the pass
    loads: list[tuple[bytes, int, int]] = field(default_factory=list)  # (digest, slot, position) from the row store


class RowSharing:
    """The digests of computed rows, where their keys and values are, and what the sampling ones sampled."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        # rows kept beyond this lockstep (run --sample auto's rounds): None unless a run opened one
        self.store = RowStore.current()
        # every sequence that holds a digest's keys and values (it computed them, or had them copied in):
        # when the first finishes, a later one that still runs can hand them on
        self.holders: dict[bytes, list[Source]] = {}
        # (digest, LM head order, final norm order) -> the token sampled from that row's logits
        self.sampled: dict[tuple[bytes, int, int], Sampled] = {} if self.store is None else self.store.sampled
        # plan bodies numbered for the digests: one numbering for every lockstep that shares a row store
        self._plans: dict[tuple[object, ...], bytes] = {} if self.store is None else self.store.plans

    def new_pass(self) -> SharedPass:
        return SharedPass(BatchBuilder(self.cache))

    def digests(self, seq: Sequence, n: int, plan: StepPlan) -> list[bytes]:
        """The lineage digests of `seq`'s next n positions computed under `plan`."""
        start = seq.num_computed
        previous = seq.lineage_before(start)
        if previous is None:  # keys and values of unknown origin: its rows match no other
            previous = os.urandom(16)
        # a row's keys, values and hidden state follow the plan's body (its TP size and all-reduce included);
        # the LM head and final norm orders matter only to what a sampling row samples (`sampled` is keyed by
        # them, and by the digest, which holds the TP size that shards the LM head too)
        body = (plan.projections, plan.norms, plan.attention_splits, plan.tp)
        plan_id = self._plans.setdefault(body, struct.pack("<Q", len(self._plans)))
        keys = []
        for position in range(start, start + n):
            previous = hashlib.blake2b(previous + plan_id + struct.pack("<qq", seq.token_ids[position], position),
                                       digest_size=16).digest()
            keys.append(previous)
        return keys

    def _earlier(self, key: bytes) -> Source | Stored | None:
        holders = self.holders.get(key, [])
        while holders and not holders[0].valid:  # its slot went to another sequence
            holders.pop(0)
        if holders:
            return holders[0]
        return Stored(key) if self.store is not None and self.store.has(key) else None

    def arrange(self, current: SharedPass, step: PlannedStep,
                digests: list[list[bytes]] | None = None) -> tuple[int, list[SeqRows]]:
        """How many rows `step` would add to `current`, and what each of its sequences shares (rows of this
        pass, its own step included, or earlier computations). Packs nothing. `digests`: the step's, from an
        earlier arrangement (a step that moves on to the next pass is not hashed again)."""
        rows: dict[bytes, int] = {}  # rows this step would compute, at the packed rows they would get
        next_row, seqs = current.builder.num_rows, []
        # routed experts whose matmul order follows how many of the step's rows an expert gets (split-K): a row's
        # bits depend on every row of its step, so each is computed in its step, fillers included, and shared with
        # nothing (its digest is random)
        rowwise = step.plan.experts is None or not step.plan.experts.follows_batch
        for index, (seq, n) in enumerate(step.scheduled):
            if not rowwise:
                seqs.append(SeqRows(seq, seq.num_computed, n, [os.urandom(16) for _ in range(n)], keep=False))
                next_row += n
                if seqs[-1].samples:
                    seqs[-1].sample_row = next_row - 1
                continue
            computed = seq.computed_of(n)  # the rest of its rows only shape the step (a filler's)
            entry = SeqRows(seq, seq.num_computed, n, [] if not computed else
                            digests[index] if digests is not None else self.digests(seq, computed, step.plan))
            for key in entry.digests:
                source = current.rows.get(key, rows.get(key))
                if source is None:
                    source = self._earlier(key)
                if source is None:
                    break
                entry.sources.append(source)
            if computed < n:  # what it samples, nobody reads
                entry.reused = UNREAD if entry.samples else None
            elif entry.samples and len(entry.sources) == n:
                source = entry.sources[-1]
                entry.reused = self.sampled.get((entry.digests[-1], step.plan.lm_head, step.plan.final))
                if entry.reused is None and isinstance(source, int):
                    entry.sample_row = source  # sampled again from the row this pass computes
                elif entry.reused is None:  # computed earlier, never sampled under this plan: compute it here
                    entry.sources.pop()
            for i in range(len(entry.sources), computed):
                rows.setdefault(entry.digests[i], next_row)
                next_row += 1
            if entry.samples and entry.reused is None and len(entry.sources) < n:
                entry.sample_row = next_row - 1
            seqs.append(entry)
        return next_row - current.builder.num_rows, seqs

    def add(self, current: SharedPass, step: PlannedStep, seqs: list[SeqRows]) -> None:
        """Pack `step` into `current` as `arrange` decided."""
        builder, length = current.builder, self.cache.length
        builder.begin_step()
        for entry in seqs:
            seq, start = entry.seq, entry.start
            assert seq.slot is not None
            current.skipped += entry.n - len(entry.digests)
            if not entry.digests:
                continue
            for i, source in enumerate(entry.sources):
                if isinstance(source, int):
                    builder.share(source, seq, start + i)
                elif isinstance(source, Stored):
                    current.loads.append((source.digest, seq.slot, start + i))
                else:
                    assert source.seq.slot is not None
                    current.copies.append((source.seq.slot * length + source.position, seq.slot * length + start + i))
            computed = len(entry.sources)
            if computed < len(entry.digests):
                first = builder.num_rows
                builder.add(seq, start + computed, start + len(entry.digests), step.plan)
                for i in range(computed, len(entry.digests)):
                    current.rows.setdefault(entry.digests[i], first + i - computed)
            if entry.sample_row is not None:
                builder.sample(entry.sample_row)
            current.shared += computed
        builder.end_step(step.plan)
        current.steps.append((step, seqs))

    def copy(self, current: SharedPass) -> None:
        """The rows `current` takes from earlier passes (so far), into the slots of the sequences that need
        them: before its forward pass, and before any step outside it could free a slot it copies from."""
        if current.copies:
            src, dst = zip(*current.copies)
            device = self.cache.device
            self.cache.copy_rows(torch.tensor(src, device=device), torch.tensor(dst, device=device))
        if current.loads and self.store is not None:
            self.store.load(self.cache, current.loads)
        current.copies, current.loads = [], []

    def results(self, current: SharedPass, sampled: Seq[Sampled]) -> list[list[Sampled]]:
        """Each step's sampled tokens (from the pass's sampling rows, in order, or reused), and every row
        of the pass recorded as computed — call before the steps are committed."""
        per_step: list[list[Sampled]] = []
        next_sample = 0
        for step, seqs in current.steps:
            out = []
            for entry in seqs:
                result = entry.reused
                if result is None and entry.sample_row is not None:
                    result = sampled[next_sample]
                    next_sample += 1
                if result is not None:
                    out.append(result)
                if entry.digests:
                    if result is not None and len(entry.digests) == entry.n:  # a row that sampled
                        self.sampled.setdefault((entry.digests[-1], step.plan.lm_head, step.plan.final), result)
                    self._record(entry)
            per_step.append(out)
        return per_step

    def _record(self, entry: SeqRows) -> None:
        seq = entry.seq
        computed = len(entry.sources)
        if self.store is not None and entry.keep and computed < len(entry.digests):
            assert seq.slot is not None
            self.store.keep(self.cache, seq.slot, entry.start + computed, entry.digests[computed:])
        for i, key in enumerate(entry.digests):
            self.holders.setdefault(key, []).append(Source(seq, entry.start + i))
        del seq.lineage[entry.start:]
        seq.lineage.extend(entry.digests)
