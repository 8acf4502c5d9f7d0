"""A run's replay: every (composition, repeat), simulated together in shared forward passes or replayed
physically one after the other, each finished one saved in the run directory at once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flakecheck.compositions import Composition
from flakecheck.engine import LLMEngine, LoadedModel, build_model
from flakecheck.replay.physical import replay
from flakecheck.replay.requests import CaseRequest
from flakecheck.traces import Trace

if TYPE_CHECKING:
    from flakecheck.config import RunConfig
    from flakecheck.engine.spec import EngineSpec
    from flakecheck.progress import ReplayProgress
    from flakecheck.replay.simulated import RunTraces
    from flakecheck.rundir import RunDirectory


def replay_runs(model: LoadedModel, config: RunConfig, spec: EngineSpec, cases: Sequence[CaseRequest],
                work: Sequence[tuple[Composition, int]], directory: RunDirectory, resume: bool,
                bar: ReplayProgress) -> tuple[list[Trace], float, dict[str, Any]]:
    """Every (composition, repeat) of a run, simulated together or replayed one after the other; each
    finished one is saved at once in the run directory (on resume, the saved ones are read back
    instead of replayed). Returns the traces in work order, the replay time, and how it replayed."""
    from flakecheck.analysis import run_label

    ops = spec.ops()
    done: dict[tuple[str, int], list[Trace]] = {}
    mode, why = replay_mode(config, spec)
    info: dict[str, Any] = {"mode": mode, **({"fallback": why} if why else {})}
    todo = []
    for composition, repeat in work:
        saved = directory.saved_traces(composition.name, repeat) if resume else None
        if saved is not None:
            bar.skip(run_label(composition.name, repeat), len(saved))
            done[(composition.name, repeat)] = saved
        else:
            todo.append((composition, repeat))
    t0 = time.perf_counter()
    if todo and mode == "simulated":
        from flakecheck.replay.simulated import simulate

        def finished_run(run: RunTraces) -> None:
            traces = run.ordered()
            directory.save_traces(run.name, run.repeat, traces)
            done[(run.name, run.repeat)] = traces

        bar.start(f"{len(todo)} simulated")
        lockstep = simulate(model, build_model(model, ops), cases, todo, bar.case_done, finished_run)
        info.update(vars(lockstep.stats))
    elif todo:
        engine = LLMEngine(model, ops)
        for composition, repeat in todo:
            bar.start(run_label(composition.name, repeat))
            traces = replay(engine, cases, composition, repeat, on_case_done=bar.case_done)
            directory.save_traces(composition.name, repeat, traces)
            done[(composition.name, repeat)] = traces
    replay_s = time.perf_counter() - t0
    return [t for composition, repeat in work for t in done[(composition.name, repeat)]], replay_s, info


def replay_mode(config: RunConfig, spec: EngineSpec) -> tuple[str, str | None]:
    """How a run's compositions are replayed — simulated together unless asked for physical replay, the
    kernels are the framework's own (their bits depend on the physical batch), or this machine's self-check
    found a primitive whose rows depend on what shares the call — and why it fell back, if it did."""
    if config.replay == "physical" or config.kernels.physical:
        return "physical", None
    if not spec.verification.simulated:
        failed = ", ".join(spec.verification.failed)
        return "physical", (f"simulated replay needs row-invariant kernels, and {failed} is not row-invariant "
                            f"on this machine: replaying each composition physically (bitwise what simulated "
                            f"replay promises, slower)")
    return "simulated", None
