"""Targeted replays: the token ids of chosen cases under chosen (composition, repeat, kernel policy) variants,
all in one simulated lockstep, reusing what the run recorded wherever a variant computes what a recorded
composition computed.

Two variants compute the same thing when they have the same policy and either are both serial without a
prefix cache and with the same engine knobs (chunk budget, tensor parallelism: what the axes set; a case is
then alone in every step: arrival order, repeat and fillers cannot touch it), or have equal composition
fields (the name aside) and the same repeat.

Only what is needed is replayed: a serial variant only for the cases asked of it, a batched one whole (its
other cases are batch-mates that shape every step), each case only up to its window when one is given (the
lockstep stops a core once its cases have their windows; every step before that is the full replay's, so
the tokens are the first tokens of the full replay — see flakecheck.replay.simulated.Simulation).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from flakecheck.data.compositions import Composition
from flakecheck.data.traces import Trace, run_label
from flakecheck.engine import LoadedModel
from flakecheck.engine.models import CausalLM
from flakecheck.explain.source import RunSource
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.replay.cluster import Cluster
from flakecheck.replay.driver import SHARDS_PER_WORKER
from flakecheck.replay.requests import knobs
from flakecheck.replay.shards import Shard, Unit, balance, case_rows, plan_shards
from flakecheck.replay.simulated import Job, Simulation
from flakecheck.run.progress import ReplayProgress


@dataclass(frozen=True)
class Variant:
    """One computation: a composition (its repeat's arrival order and fillers) under a kernel policy."""

    composition: Composition
    repeat: int
    policy: KernelPolicy

    def label(self, run_policy: KernelPolicy) -> str:
        """'batch8', 'batch8 #1', 'solo [matmul=splitk,attention=invariant,norm=invariant]'."""
        name = run_label(self.composition.name, self.repeat)
        return name if self.policy == run_policy else f"{name} [{self.policy.name}]"


def computation_key(variant: Variant) -> tuple[Any, ...]:
    """Equal for two variants exactly when they compute the same tokens (see the module docstring)."""
    c = variant.composition
    if c.cases_alone:
        return ("serial", knobs(c), variant.policy)
    fields = c.to_dict()
    fields.pop("name")
    return (json.dumps(fields, sort_keys=True), variant.repeat, variant.policy)


@dataclass
class ReplayStats:
    jobs: int = 0
    reused: int = 0  # variants answered from the run's recorded traces
    seconds: float = 0.0
    lockstep: dict[str, int] = field(default_factory=dict)
    cluster: dict[str, Any] | None = None  # the cluster's stats when the replays ran on one


class Replays:
    """Collect what is needed (`need`), replay it once (`run`), then read tokens (`tokens`)."""

    def __init__(self, source: RunSource) -> None:
        self.source = source
        self.recorded = {computation_key(Variant(c, r, source.policy)): (c.name, r) for c, r in source.work}
        self.wanted: dict[tuple[Any, ...], tuple[Variant, dict[str, int | None]]] = {}
        self.replayed: dict[tuple[Any, ...], dict[str, Trace]] = {}
        self.reused: set[tuple[Any, ...]] = set()
        self.stats = ReplayStats()

    def is_recorded(self, variant: Variant) -> bool:
        return computation_key(variant) in self.recorded

    def need(self, variant: Variant, case_id: str, window: int | None = None) -> None:
        """The case's first `window` tokens under `variant` (None: all of them)."""
        key = computation_key(variant)
        if key in self.recorded:
            self.reused.add(key)
            return
        _, cases = self.wanted.setdefault(key, (variant, {}))
        old = cases.get(case_id, 0)  # None: the whole output is already wanted
        cases[case_id] = None if window is None or old is None else max(window, old)

    def run(self, model: LoadedModel, network: CausalLM, progress: bool = False,
            cluster: Cluster | None = None) -> ReplayStats:
        """Every needed variant that the run did not record, in one lockstep (or in shards on `cluster`)."""
        if not self.wanted:
            return self.stats
        jobs: list[tuple[tuple[Any, ...], Job]] = []
        windows: dict[str, int] = {}
        for i, (key, (variant, cases)) in enumerate(self.wanted.items()):
            policy = None if variant.policy == self.source.policy else variant.policy
            jobs.append((key, Job(variant.composition, variant.repeat, policy, f"v{i}", frozenset(cases))))
            for case_id, window in cases.items():
                if window is not None:  # a case needed by several variants runs to its widest window in each
                    windows[case_id] = max(window, windows.get(case_id, 0))
        full = {c for _, (_, cases) in self.wanted.items() for c, w in cases.items() if w is None}
        started = time.perf_counter()
        total = sum(len(cases) for _, cases in self.wanted.values())
        # a core stops once its cases have their windows (or, without one, have finished): a batch's other
        # cases are not run past that, a serial core with a prefix cache that reports no case past its prompt
        windows = {c: w for c, w in windows.items() if c not in full}
        with ReplayProgress(total, enabled=progress) as bar:
            bar.start(f"{len(jobs)} variants")
            if cluster is not None:
                got = self._on_cluster(cluster, [job for _, job in jobs], windows, bar)
            else:
                simulation = Simulation(model, network, self.source.requests, [job for _, job in jobs],
                                        bar.case_done, lambda run: None, windows=windows)
                simulation.lockstep.run()
                got = {(job.name, c): simulation.trace(job, c) for _, job in jobs for c in job.cases or ()}
                self.stats.lockstep = dict(vars(simulation.lockstep.stats))
        for key, job in jobs:
            self.replayed[key] = {}
            for case_id in job.cases or ():
                trace = got.get((job.name, case_id))
                assert trace is not None, (job.name, case_id)
                self.replayed[key][case_id] = trace
        self.stats.jobs = len(jobs)
        self.stats.reused = len(self.reused)
        self.stats.seconds = time.perf_counter() - started
        return self.stats

    def _on_cluster(self, cluster: Cluster, jobs: list[Job], windows: dict[str, int],
                    bar: ReplayProgress) -> dict[tuple[str, str], Trace | None]:
        """The jobs in shards on the cluster's actors: a batched variant is one unit (its cases are batch-mates),
        a serial one a unit per case (alone in every step); packed by predicted rows."""
        requests = {r.case_id: r for r in self.source.requests}

        def rows(case_id: str) -> int:
            window = windows.get(case_id)
            request = requests[case_id]
            return case_rows(request) if window is None else len(request.prompt_ids) + window

        units = []
        for job in jobs:
            cases = sorted(job.cases or ())
            if job.composition.cases_alone:
                units += [Unit((replace(job, cases=frozenset({c})),), rows(c)) for c in cases]
            else:
                units.append(Unit((job,), sum(rows(c) for c in requests)))
        shards = plan_shards(units, SHARDS_PER_WORKER * max(1, len(cluster.actors)))
        got: dict[tuple[str, str], Trace | None] = {}

        def on_shard(_: Shard, traces: list[Trace]) -> None:
            got.update({(t.composition, t.case_id): t for t in traces})

        cluster.run(self.source.requests, shards, on_shard, lambda case_id, tokens: bar.tokens_done(tokens),
                    windows=windows)
        self.stats.cluster = {**asdict(cluster.stats), "predicted_balance": round(balance(shards), 3)}
        return got

    def tokens(self, variant: Variant, case_id: str, window: int | None = None) -> list[int]:
        """The case's tokens under `variant` (its first `window` when given): recorded or replayed."""
        key = computation_key(variant)
        if key in self.recorded:
            tokens = self.source.recorded[self.recorded[key]][case_id]
        else:
            tokens = self.replayed[key][case_id].token_ids
        return list(tokens if window is None else tokens[:window])

    def finish_reason(self, variant: Variant, case_id: str) -> str:
        key = computation_key(variant)
        if key in self.recorded:
            return self.source.finish[self.recorded[key]][case_id]
        return self.replayed[key][case_id].finish_reason
