"""Many engine cores, one model: every core's next step runs in a shared physical forward pass.

Each core (a composition, or one case of a serial composition) schedules its own steps with its own
limits, clock, sequences and prefix cache; a tick asks every admitted core for its next step, plans
each step from that step's own shape, packs the steps (within a row budget, so memory stays
bounded) into forward passes, and hands each core its sampled tokens. With row-invariant kernels
(the `splitk` and `invariant` policies), a row's bits depend only on its own data and its own
step's plan, so every core computes exactly what it would alone — and rows that are the same
computation in several cores (the same prompt prefilled under the same plan, say) are computed once
(flakecheck/replay/shared_rows.py).

The KV cache is one pool of slots; a core is admitted when the pool can hold its widest step
(`max_num_seqs` slots) and its `ready()` says so (a serial composition with a prefix cache makes
a case wait until the earlier cases it shares a prefix with have written their prompt's KV).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from flakecheck.engine.engine_core import EngineCore, Sampled, Scheduled
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.model_runner import ModelRunner
from flakecheck.engine.models import CausalLM
from flakecheck.engine.sequence import Completion
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.kernels.tensor_parallel import TensorParallel
from flakecheck.replay.shared_rows import RowSharing, SharedPass


@dataclass
class Member:
    """A core in the lockstep, what it calls on each finished request, and when it may start."""

    core: EngineCore
    on_finish: Callable[[Completion], None]
    ready: Callable[[], bool] = field(default=lambda: True)
    policy: KernelPolicy | None = None  # plans this core's steps (None: the network's own policy)
    tp: TensorParallel = TensorParallel()  # the tensor parallelism its steps are planned at
    # whether the core has computed all that is wanted of it: it then stops, its unfinished requests end
    # with finish_reason "window" (handed to on_finish as they are) and their KV slots return to the pool
    done: Callable[[], bool] = field(default=lambda: False)

    @property
    def slots(self) -> int:
        return self.core.scheduler.max_num_seqs


@dataclass
class LockstepStats:
    ticks: int = 0
    forward_passes: int = 0
    rows: int = 0  # rows computed
    shared_rows: int = 0  # rows of the steps that another sequence's identical row computed
    skipped_rows: int = 0  # rows of shape-only requests (fillers): they shape their steps, nothing reads them
    steps: int = 0
    peak_rows: int = 0
    peak_slots: int = 0


class Lockstep:
    def __init__(self, network: CausalLM, cache: KVCache, max_rows: int = 2048) -> None:
        self.network, self.cache, self.max_rows = network, cache, max_rows
        self.runner = ModelRunner(network, cache)
        self.sharing = RowSharing(cache)
        self.pending: list[Member] = []
        self.active: list[Member] = []
        self.free_slots = cache.shape[0]
        self.stats = LockstepStats()

    def add(self, member: Member) -> None:
        if member.slots > self.cache.shape[0]:
            raise ValueError(f"a core needs {member.slots} KV slots; the pool has {self.cache.shape[0]}")
        self.pending.append(member)

    def run(self) -> None:
        """Tick until every member has finished."""
        while self.pending or self.active:
            self._admit()
            if not self.active:
                if self.pending and not any(m.ready() for m in self.pending):
                    raise RuntimeError("lockstep: every waiting core waits on another; nothing can run")
                continue
            self._tick(list(self.active))

    def _propose(self, member: Member) -> Scheduled:
        """The member's next step; empty when it has finished (it leaves the lockstep)."""
        if member.done():
            self._stop(member)
        scheduled = member.core.propose()
        if not scheduled:
            self.active.remove(member)
            self.free_slots += member.slots
        return scheduled

    @staticmethod
    def _stop(member: Member) -> None:
        core = member.core
        for seq in [*core.scheduler.running, *core.scheduler.waiting]:
            completion = core.abort(seq.request_id, "window")
            if completion is not None:
                member.on_finish(completion)

    def _admit(self) -> None:
        for member in list(self.pending):
            if member.slots <= self.free_slots and member.ready():
                self.pending.remove(member)
                self.active.append(member)
                self.free_slots -= member.slots
        self.stats.peak_slots = max(self.stats.peak_slots, self.cache.shape[0] - self.free_slots)

    def _tick(self, active: list[Member]) -> None:
        """Each member's next step that computes a row, packed in order into forward passes of at most
        max_rows computed rows (a larger step runs alone); rows another sequence computes are not computed
        again. A step before it that computes nothing (shape-only rows, rows copied or loaded from earlier
        computations) runs at once, with no forward pass: a core's steps depend on its own schedule alone, so
        they need not wait for another core's, and the passes gather more rows each."""
        self.stats.ticks += 1
        current = self.sharing.new_pass()
        members: list[Member] = []
        for member in active:
            while scheduled := self._propose(member):
                step = self.runner.plan(scheduled, member.policy, member.tp)
                rows, seqs = self.sharing.arrange(current, step)
                if rows == 0 and not any(e.sample_row is not None or any(isinstance(s, int) for s in e.sources)
                                         for e in seqs):  # nothing of this pass is read: it runs now
                    # its sequences may finish and their slots go to others: the pass's copies are made first
                    self.sharing.copy(current)
                    alone = self.sharing.new_pass()
                    self.sharing.add(alone, step, seqs)
                    self._run(alone, [member])
                    continue
                if current.steps and current.builder.num_rows + rows > self.max_rows:
                    self._run(current, members)
                    current, members = self.sharing.new_pass(), []
                    rows, seqs = self.sharing.arrange(current, step, [entry.digests for entry in seqs])
                self.sharing.add(current, step, seqs)
                members.append(member)
                break
        self._run(current, members)

    def _run(self, current: SharedPass, members: list[Member]) -> None:
        rows = current.builder.num_rows
        self.stats.forward_passes += rows > 0
        self.stats.rows += rows
        self.stats.shared_rows += current.shared
        self.stats.skipped_rows += current.skipped
        self.stats.steps += len(current.steps)
        self.stats.peak_rows = max(self.stats.peak_rows, rows)
        self.sharing.copy(current)
        sampled: list[Sampled] = []
        if rows:
            model = self.network
            sampled = self.runner.sampled(current.builder.build(model.ops, model.group))
        for member, (step, _), results in zip(members, current.steps, self.sharing.results(current, sampled)):
            for completion in member.core.commit(step.scheduled, results):
                member.on_finish(completion)
