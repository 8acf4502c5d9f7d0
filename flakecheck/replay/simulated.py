"""Simulated replay: every composition (and repeat) of a run at once, in shared forward passes.

Under row-invariant kernels a case's numbers depend only on its own data and on the plans of the
steps its composition schedules, so each composition becomes engine cores (virtual engines) that
advance in lockstep (flakecheck/replay/lockstep.py); the result is bitwise the result of
replaying each composition alone (tests/test_simulation.py checks it). How a composition becomes
cores:

- `max_batch` > 1: one core with the composition's limits, prefix cache and every request
  (cases and fillers): its steps are exactly the steps the composition schedules. Without a prefix
  cache a filler only shapes those steps (its length is fixed, no case reads its values): it is
  scheduled but not computed.
- `max_batch` 1, no prefix cache: every step holds one sequence, so a case is its own core and
  fillers cannot touch it (they are not run). Such a core is the same computation whichever serial
  composition or repeat it belongs to (same prompt, token limit and chunk budget): it runs once
  and its trace is reported for each.
- `max_batch` 1 with a prefix cache: a case reuses KV that earlier cases' prefills wrote. Each
  request is its own core over one shared prefix cache, admitted in the serial order only once
  every earlier request that shares its first prompt block has finished its prefill (then every
  block it can look up is there, and no later request's block can be: a later request waits for
  it). Decodes, which write nothing to the prefix cache, overlap freely. A cache small enough to
  evict could diverge from serial order: those compositions run as one serial core instead.

`native` kernels depend on the physical batch: never simulated (api chooses physical replay).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flakecheck.data.compositions import Composition
from flakecheck.data.traces import Trace
from flakecheck.engine import Completion, EngineCore, Knobs, LoadedModel, Request
from flakecheck.engine.llm_engine import kv_cache
from flakecheck.engine.models import CausalLM
from flakecheck.engine.prefix_cache import PrefixCache, block_hashes
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.replay.lockstep import Lockstep, Member
from flakecheck.replay.requests import (
    CaseRequest,
    build_requests,
    is_filler,
    knobs,
    readable_blocks,
    shape_from,
    trace_of,
)

MAX_SLOTS = 256  # KV slots in the pool: sequences held at once across every core
MAX_ROWS = 2048  # rows of one physical forward pass


@dataclass(frozen=True)
class Job:
    """One (composition, repeat) to simulate; `policy` plans its steps (None: the network's own),
    `label` names its traces (default: the composition's name), `cases` restricts which cases
    report (a serial composition then runs only those: its cases cannot touch each other)."""

    composition: Composition
    repeat: int = 0
    policy: KernelPolicy | None = None
    label: str | None = None
    cases: frozenset[str] | None = None

    @property
    def name(self) -> str:
        return self.label or self.composition.name


@dataclass
class RunTraces:
    """The traces of one job as they finish; complete when every case it reports has one."""

    composition: Composition
    repeat: int
    case_ids: list[str]
    traces: dict[str, Trace] = field(default_factory=dict)
    name: str = ""

    @property
    def done(self) -> bool:
        return len(self.traces) == len(self.case_ids)

    def ordered(self) -> list[Trace]:
        return [self.traces[c] for c in self.case_ids]


def simulate(model: LoadedModel, network: CausalLM, cases: Sequence[CaseRequest],
             work: Sequence[tuple[Composition, int] | Job], on_case_done: Callable[[Trace], None],
             on_run_done: Callable[[RunTraces], None], max_slots: int = MAX_SLOTS,
             max_rows: int = MAX_ROWS) -> Lockstep:
    """Replay every job of `work` in lockstep; `on_run_done` gets each as it completes. Returns the lockstep
    (its stats)."""
    simulation = Simulation(model, network, cases, work, on_case_done, on_run_done, max_slots, max_rows)
    simulation.lockstep.run()
    return simulation.lockstep


class Simulation:
    """Every job of `work`, built into one lockstep (not yet run): `lockstep.run()` replays them, and
    `trace` reads what a job's case generated.

    `windows` (case id -> tokens) asks for only the first tokens of those cases: a core stops as soon as
    every case it reports has them (its traces then end with finish_reason "window"), a serial core with a
    prefix cache that reports no case once its prompt's KV is written. Nothing is cut short before that, so
    every step up to it — and every batch-mate's schedule — is the step the full replay makes: each case's
    tokens are the first tokens of its full replay. A reported case without a window runs to its end."""

    def __init__(self, model: LoadedModel, network: CausalLM, cases: Sequence[CaseRequest],
                 work: Sequence[tuple[Composition, int] | Job], on_case_done: Callable[[Trace], None],
                 on_run_done: Callable[[RunTraces], None], max_slots: int = MAX_SLOTS,
                 max_rows: int = MAX_ROWS, windows: Mapping[str, int] | None = None) -> None:
        vocab = model.config.vocab_size
        special = frozenset(getattr(model.tokenizer, "all_special_ids", []) or []) | model.eos_token_ids
        jobs = [item if isinstance(item, Job) else Job(*item) for item in work]
        plans = [(job, build_requests(cases, job.composition, job.repeat, vocab, special)) for job in jobs]
        longest = max(len(r.prompt_ids) + r.params.max_tokens for _, requests in plans for r in requests)
        widest = max([job.composition.max_batch for job, _ in plans] + [1])
        cache = kv_cache(model, max(max_slots, widest), length=longest)
        self.lockstep = Lockstep(network, cache, max_rows)
        self._builder = _Builder(self.lockstep, model, cases, on_case_done, on_run_done, windows)
        for job, requests in plans:
            self._builder.add(job, requests)

    def trace(self, job: Job, case_id: str) -> Trace | None:
        """The case's trace under `job` once the lockstep has run: whole, or up to its window (None if the job
        does not report the case)."""
        run = self._builder.runs.get((job.name, job.repeat))
        return None if run is None else run.traces.get(case_id)


class _Builder:
    def __init__(self, lockstep: Lockstep, model: LoadedModel, cases: Sequence[CaseRequest],
                 on_case_done: Callable[[Trace], None], on_run_done: Callable[[RunTraces], None],
                 windows: Mapping[str, int] | None = None) -> None:
        self.lockstep, self.model, self.windows = lockstep, model, windows
        self.case_ids = [c.case_id for c in cases]
        self.on_case_done, self.on_run_done = on_case_done, on_run_done
        # serial cores without a prefix cache, shared by every run that schedules the same computation
        self.serial: dict[tuple[str, Knobs, KernelPolicy | None], list[RunTraces]] = {}
        self.runs: dict[tuple[str, int], RunTraces] = {}  # each job's traces, by (job name, repeat)

    def core(self, max_num_seqs: int, chunk: int | None, prefix: PrefixCache | None) -> EngineCore:
        return EngineCore(self.lockstep.cache, self.model.eos_token_ids, self.model.config.max_context,
                          max_num_seqs, chunk, prefix)

    def listener(self, runs: list[RunTraces]) -> Callable[[Completion], None]:
        """Records a finished case into each run that reports it (fillers are dropped)."""

        def finished(completion: Completion) -> None:
            if is_filler(completion.request_id):  # a filler
                return
            for run in runs:
                if str(completion.request_id) not in run.case_ids:
                    continue
                trace = trace_of(completion, run.name, run.repeat)
                run.traces[trace.case_id] = trace
                self.on_case_done(trace)
                if run.done:
                    self.on_run_done(run)

        return finished

    def add(self, job: Job, requests: list[Request]) -> None:
        composition = job.composition
        reported = [c for c in composition.measured(self.case_ids) if job.cases is None or c in job.cases]
        run = RunTraces(composition, job.repeat, reported, name=job.name)
        self.runs[(job.name, job.repeat)] = run
        if composition.cases_alone:
            for request in requests:
                if is_filler(request.request_id) or str(request.request_id) not in reported:
                    continue  # fillers and other cases never share a step with a case of a serial composition
                key = (str(request.request_id), knobs(composition), job.policy)
                if key not in self.serial:
                    self.serial[key] = []
                    core = self.core(1, key[1].max_num_batched_tokens, None)
                    core.add_request(Request(request.request_id, request.prompt_ids, request.params))
                    self.lockstep.add(Member(core, self.listener(self.serial[key]), policy=job.policy,
                                             tp=key[1].tensor_parallel,
                                             done=self.wanted(core, self.serial[key], [key[0]])))
                self.serial[key].append(run)
        elif composition.max_batch > 1:
            self._whole(job, [run], requests)
        else:
            self._serial_with_prefix(job, run, requests)

    def wanted(self, core: EngineCore, runs: list[RunTraces], case_ids: list[str]) -> Callable[[], bool]:
        """With windows: whether `core` has computed all that is wanted of it — every case it reports (to any
        of `runs`) has its window or finished; a core that reports no case, its prompts (a prefix cache's
        KV). Without windows: never (every core runs to its end)."""
        windows = self.windows
        if windows is None:
            return lambda: False
        if not case_ids:
            return core.prompts_done

        def done() -> bool:
            for case_id in case_ids:
                if all(case_id in run.traces for run in runs):
                    continue
                window = windows.get(case_id)
                if window is None:
                    return False
                generated = core.generated(case_id)
                if generated is None or generated < window:
                    return False
            return True

        return done

    def _whole(self, job: Job, runs: list[RunTraces], requests: list[Request]) -> None:
        composition = job.composition
        prefix = PrefixCache() if knobs(composition).enable_prefix_caching else None
        core = self.core(composition.max_batch, knobs(composition).max_num_batched_tokens, prefix)
        readable = None if prefix is None else readable_blocks(requests)
        for request in requests:
            core.add_request(replace(request, shape_from=shape_from(request, readable)))
        self.lockstep.add(Member(core, self.listener(runs), policy=job.policy, tp=knobs(composition).tensor_parallel,
                                 done=self.wanted(core, runs, runs[0].case_ids)))

    def _serial_with_prefix(self, job: Job, run: RunTraces, requests: list[Request]) -> None:
        prefix = PrefixCache()
        order = sorted(requests, key=lambda r: r.arrival)  # the serial admission order (stable)
        blocks = sum(len(r.prompt_ids) // prefix.block_size for r in order)
        if blocks > prefix.capacity:  # eviction would depend on the serial timing: keep it serial
            self._whole(job, [run], requests)
            return
        first_block = [_first_block(r, prefix.block_size) for r in order]
        case_groups = {key for r, key in zip(order, first_block) if not is_filler(r.request_id)}
        earlier: dict[Any, list[EngineCore]] = {}
        listener = self.listener([run])
        readable = readable_blocks(requests)
        for request, key in zip(order, first_block):
            if is_filler(request.request_id) and key not in case_groups:
                continue  # a filler that shares no prompt block with any case cannot touch one
            core = self.core(1, knobs(job.composition).max_num_batched_tokens, prefix)
            core.add_request(Request(request.request_id, request.prompt_ids, request.params,
                                     cache_salt=request.cache_salt, shape_from=shape_from(request, readable)))
            waits = list(earlier.get(key, [])) if key is not None else []
            reported = [str(request.request_id)] if str(request.request_id) in run.case_ids else []
            self.lockstep.add(Member(core, listener, lambda waits=waits: all(c.prompts_done() for c in waits),
                                     policy=job.policy, tp=knobs(job.composition).tensor_parallel,
                                     done=self.wanted(core, [run], reported)))
            if key is not None:
                earlier.setdefault(key, []).append(core)


def _first_block(request: Request, block_size: int) -> Any:
    """The key of a request's first full prompt block (None: shorter than one block, shares nothing)."""
    hashes = block_hashes(request.prompt_ids[:block_size], block_size, request.cache_salt)
    return hashes[0] if hashes else None
