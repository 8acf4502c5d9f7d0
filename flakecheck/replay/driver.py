"""A run's replay: every (composition, repeat), simulated together in shared forward passes or replayed
physically one after the other, each finished one saved in the run directory at once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Protocol

from flakecheck.data.compositions import Composition
from flakecheck.data.rundir import RunDirectory
from flakecheck.data.traces import Trace, run_label
from flakecheck.engine import LLMEngine, LoadedModel, build_model
from flakecheck.engine.spec import EngineSpec
from flakecheck.replay.cluster import Cluster
from flakecheck.replay.physical import replay
from flakecheck.replay.requests import CaseRequest
from flakecheck.replay.shards import Shard, balance, plan_shards, plan_units
from flakecheck.replay.simulated import RunTraces, simulate

SHARDS_PER_WORKER = 4  # shards a cluster's actor gets on average: finer balance, less lost with an actor


class Progress(Protocol):
    """What a replay reports as it goes (a progress bar)."""

    def start(self, label: str) -> None: ...
    def skip(self, label: str, cases: int) -> None: ...
    def case_done(self, trace: Trace) -> None: ...
    def tokens_done(self, tokens: int) -> None: ...


def replay_runs(model: LoadedModel, replay_setting: str, spec: EngineSpec, cases: Sequence[CaseRequest],
                work: Sequence[tuple[Composition, int]], directory: RunDirectory, resume: bool,
                bar: Progress, cluster: Cluster | None = None) -> tuple[list[Trace], float, dict[str, Any]]:
    """Every (composition, repeat) of a run — simulated together (in this process, or in shards on a Ray
    cluster) or replayed physically one after the other; each finished one is saved at once in the run
    directory, as is each finished shard (on resume, what was saved is read back instead of replayed).
    Returns the traces in work order, the replay time, and how it replayed."""
    mode, why = replay_mode(replay_setting, spec)
    info: dict[str, Any] = {"mode": mode, **({"fallback": why} if why else {})}
    progress = _Runs(work, cases, directory)
    if resume:
        for (name, repeat), n in progress.load_saved().items():
            bar.skip(run_label(name, repeat), n)
    todo = progress.todo()
    t0 = time.perf_counter()
    if todo and mode == "simulated" and cluster is not None:
        info.update(_on_cluster(cluster, cases, todo, progress, bar))
    elif todo and mode == "simulated":
        def finished_run(run: RunTraces) -> None:
            progress.add(run.ordered())

        bar.start(f"{len(todo)} simulated")
        lockstep = simulate(model, build_model(model, spec.ops()), cases, todo, bar.case_done, finished_run)
        info.update(vars(lockstep.stats))
    elif todo:
        if cluster is not None:
            info["cluster"] = "not used: physical replay runs each composition in this process"
        engine = LLMEngine(model, spec.ops())
        for composition, repeat in todo:
            bar.start(run_label(composition.name, repeat))
            progress.add(replay(engine, cases, composition, repeat, on_case_done=bar.case_done))
    replay_s = time.perf_counter() - t0
    return progress.ordered(), replay_s, info


def _on_cluster(cluster: Cluster, cases: Sequence[CaseRequest], todo: list[tuple[Composition, int]], progress: _Runs,
                bar: Progress) -> dict[str, Any]:
    """The remaining work in shards on the cluster's actors (what a saved shard already holds is not redone)."""
    units = [u for u in plan_units(cases, todo) if not progress.covers(u.jobs)]
    shards = plan_shards(units, SHARDS_PER_WORKER * max(1, len(cluster.actors)))
    bar.start(f"{len(shards)} shards")

    def on_shard(shard: Shard, traces: list[Trace]) -> None:
        progress.directory.save_shard(shard.key, traces)  # kept on Ctrl-C: a resume does not redo it
        progress.add(traces)

    cluster.run(cases, shards, on_shard, lambda case_id, tokens: bar.tokens_done(tokens))
    stats = asdict(cluster.stats)
    stats["predicted_balance"] = round(balance(shards), 3)
    return {"cluster": stats, "rows": cluster.stats.computed_rows}


class _Runs:
    """The traces of a run's (composition, repeat)s as they arrive, whole or a shard at a time; each whole
    one saved once it is complete."""

    def __init__(self, work: Sequence[tuple[Composition, int]], cases: Sequence[CaseRequest],
                 directory: RunDirectory) -> None:
        self.work, self.directory = list(work), directory
        self.case_ids = [c.case_id for c in cases]
        # the cases each (composition, repeat) reports (`run --sample auto` leaves out those no longer measured)
        self.expected = {(c.name, r): c.measured(self.case_ids) for c, r in self.work}
        self.traces: dict[tuple[str, int], dict[str, Trace]] = {(c.name, r): {} for c, r in self.work}
        self.saved: set[tuple[str, int]] = set()

    def load_saved(self) -> dict[tuple[str, int], int]:
        """Read what an interrupted attempt saved: whole runs, then shards. Returns the whole runs' sizes."""
        whole = {}
        for composition, repeat in self.work:
            saved = self.directory.saved_traces(composition.name, repeat)
            if saved is not None:
                self.traces[(composition.name, repeat)] = {t.case_id: t for t in saved}
                self.saved.add((composition.name, repeat))
                whole[(composition.name, repeat)] = len(saved)
        self.add(self.directory.saved_shard_traces())
        return whole

    def add(self, traces: Sequence[Trace]) -> None:
        for trace in traces:
            key = (trace.composition, trace.repeat)
            if key in self.traces:
                self.traces[key][trace.case_id] = trace
        for key, got in self.traces.items():
            if key not in self.saved and len(got) == len(self.expected[key]):
                self.directory.save_traces(key[0], key[1], [got[c] for c in self.expected[key]])
                self.saved.add(key)

    def todo(self) -> list[tuple[Composition, int]]:
        return [(c, r) for c, r in self.work if (c.name, r) not in self.saved]

    def covers(self, jobs: Sequence[Any]) -> bool:
        """Whether every trace these jobs report is already here."""
        return all(case in self.traces.get((job.name, job.repeat), {}) for job in jobs for case in job.cases or ())

    def ordered(self) -> list[Trace]:
        return [self.traces[(c.name, r)][case] for c, r in self.work for case in self.expected[(c.name, r)]]


def replay_mode(replay_setting: str, spec: EngineSpec) -> tuple[str, str | None]:
    """How a run's compositions are replayed — simulated together unless asked for physical replay, the
    kernels are the framework's own (their bits depend on the physical batch), or this machine's self-check
    found a primitive whose rows depend on what shares the call — and why it fell back, if it did."""
    if replay_setting == "physical" or spec.policy.physical:
        return "physical", None
    if not spec.verification.simulated:
        failed = ", ".join(spec.verification.failed)
        return "physical", (f"simulated replay needs row-invariant kernels, and {failed} is not row-invariant "
                            f"on this machine: replaying each composition physically (bitwise what simulated "
                            f"replay promises, slower)")
    return "simulated", None
