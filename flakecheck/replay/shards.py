"""Shards: a run's replay cut into independent pieces of work, balanced by predicted cost.

The pieces are the virtual engines of simulated replay. A batched composition's schedule couples its
cases (who shares a step decides every step's plan), and a serial composition with a prefix cache
couples them through the cache, so each such (composition, repeat) is one unit. A serial composition
without a prefix cache runs each case alone, so its cases are units of their own — one per case,
holding that case under every such composition and repeat (they compute the same rows, shared once).
Units are packed into shards, longest first onto the lightest shard (LPT), by predicted rows: every
prompt token and every token a case may generate, computed once.

A shard's traces are bitwise what the whole run computes for them in one process: under row-invariant
kernels a row depends only on its own data and its step's plan. What a shard cannot share with another
is rows that are the same computation in two shards (they are computed twice).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from flakecheck.data.compositions import Composition
from flakecheck.engine import Knobs
from flakecheck.replay.requests import CaseRequest, knobs
from flakecheck.replay.simulated import Job


@dataclass(frozen=True)
class Unit:
    """Work that one lockstep must do together: its jobs (each restricted to its cases) and its cost."""

    jobs: tuple[Job, ...]
    rows: int


@dataclass(frozen=True)
class Shard:
    index: int
    jobs: tuple[Job, ...]
    rows: int
    units: int = field(default=1, compare=False)

    @property
    def key(self) -> str:
        """A name for the shard's saved traces, from what it computes."""
        what = [(j.composition.name, j.repeat, sorted(j.cases) if j.cases is not None else None) for j in self.jobs]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]

    def reported(self) -> set[tuple[str, int, str]]:
        """(composition, repeat, case id) of every trace the shard gives, given the run's case ids."""
        return {(j.name, j.repeat, c) for j in self.jobs for c in (j.cases or ())}


def case_rows(case: CaseRequest) -> int:
    return len(case.prompt_ids) + case.max_tokens


def plan_units(cases: Sequence[CaseRequest], work: Sequence[tuple[Composition, int]]) -> list[Unit]:
    """The run's work as units (module docstring): every (composition, repeat) of `work` is covered once."""
    ids = frozenset(c.case_id for c in cases)
    units: list[Unit] = []
    serial: dict[str, list[Job]] = {c.case_id: [] for c in cases}
    computations: dict[str, set[Knobs]] = {c.case_id: set() for c in cases}
    total = sum(case_rows(c) for c in cases)
    for composition, repeat in work:
        if composition.cases_alone:
            for case in cases:
                serial[case.case_id].append(Job(composition, repeat, cases=frozenset({case.case_id})))
                computations[case.case_id].add(knobs(composition))
            continue
        fillers = composition.fillers
        # fillers are computed only where a prefix cache lets a case read their KV (else they shape steps only)
        filler_rows = (fillers.count * (fillers.prompt_len[1] + fillers.output_len[1])
                       if knobs(composition).enable_prefix_caching else 0)
        units.append(Unit((Job(composition, repeat, cases=ids),), total + filler_rows))
    for case in cases:
        if serial[case.case_id]:
            # one computation per engine knobs (chunk budget, TP, ...), whatever composition or repeat reports it
            units.append(Unit(tuple(serial[case.case_id]), case_rows(case) * len(computations[case.case_id])))
    return units


def plan_shards(units: Sequence[Unit], n_shards: int) -> list[Shard]:
    """Units packed into at most `n_shards` shards, longest first onto the lightest (ties: lowest index)."""
    n = max(1, min(n_shards, len(units)))
    loads = [0] * n
    packed: list[list[Unit]] = [[] for _ in range(n)]
    for unit in sorted(units, key=lambda u: -u.rows):
        lightest = min(range(n), key=lambda i: (loads[i], i))
        packed[lightest].append(unit)
        loads[lightest] += unit.rows
    return [Shard(i, tuple(job for unit in group for job in unit.jobs), loads[i], len(group))
            for i, group in enumerate(packed) if group]


def balance(shards: Sequence[Shard]) -> float:
    """The largest shard's predicted rows over the mean (1.0: perfectly even)."""
    if not shards:
        return 1.0
    mean = sum(s.rows for s in shards) / len(shards)
    return max(s.rows for s in shards) / mean if mean else 1.0
