"""Replay: push the whole suite through the engine's scheduler under one composition.

Batch-mates are the other cases plus synthetic filler requests, as in a real server; this is
never a loop of solo calls. Only the cases' completions become traces; fillers are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flakecheck.compositions import Composition, arrival_order, make_fillers
from flakecheck.engine import Completion, LLMEngine, LoadedModel, Request, SamplingParams, build_model
from flakecheck.traces import Trace

if TYPE_CHECKING:
    from flakecheck.config import RunConfig
    from flakecheck.engine.spec import EngineSpec
    from flakecheck.progress import ReplayProgress
    from flakecheck.rundir import RunDirectory
    from flakecheck.simulation import RunTraces


@dataclass(frozen=True)
class CaseRequest:
    """A suite case as the engine sees it: its id, prompt token ids and token limit."""

    case_id: str
    prompt_ids: list[int]
    max_tokens: int


def trace_of(c: Completion, composition: str, repeat: int) -> Trace:
    return Trace(str(c.request_id), composition, repeat, c.token_ids, c.top1_ids, c.top1_logprobs,
                 c.top2_ids, c.top2_logprobs, c.finish_reason, c.top1_logits)


def build_requests(cases: Sequence[CaseRequest], composition: Composition, repeat: int,
                   vocab_size: int, special_ids: frozenset[int]) -> list[Request]:
    """Cases in this composition's arrival order, fillers spread evenly among them (or arriving later)."""
    order = arrival_order(len(cases), composition, repeat)
    requests = [Request(cases[i].case_id, cases[i].prompt_ids, SamplingParams(cases[i].max_tokens)) for i in order]
    fillers = make_fillers(composition, vocab_size, special_ids, repeat, len(cases))
    as_request = [Request(("filler", k), f.prompt_ids, SamplingParams(f.max_tokens, True), f.arrival)
                  for k, f in enumerate(fillers)]
    together = [r for r in as_request if r.arrival == 0]
    # The scheduler keeps submission order among equal arrival steps: interleaving makes the
    # fillers batch-mates of the cases instead of a tail that runs after them. Inserting from
    # the back keeps the earlier positions valid.
    for k in range(len(together) - 1, -1, -1):
        requests.insert(round((k + 1) * len(cases) / (len(together) + 1)), together[k])
    requests.extend(r for r in as_request if r.arrival > 0)
    return requests


def replay(engine: LLMEngine, cases: Sequence[CaseRequest], composition: Composition, repeat: int,
           on_case_done: Callable[[Trace], None] | None = None) -> list[Trace]:
    """Every case under one composition, through the scheduler; traces in suite order."""
    engine.reconfigure(composition.max_batch, composition.chunk, composition.prefix_cache)
    vocab = engine.loaded.config.vocab_size
    special = frozenset(getattr(engine.loaded.tokenizer, "all_special_ids", []) or []) | engine.eos_token_ids
    traces: dict[str, Trace] = {}

    def finished(completion: Completion) -> None:
        if isinstance(completion.request_id, tuple):  # a filler
            return
        trace = trace_of(completion, composition.name, repeat)
        traces[trace.case_id] = trace
        if on_case_done is not None:
            on_case_done(trace)

    engine.generate(build_requests(cases, composition, repeat, vocab, special), on_finish=finished)
    return [traces[c.case_id] for c in cases]


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
        from flakecheck.simulation import simulate

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
