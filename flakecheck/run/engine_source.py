"""The built-in engine as a source of traces: `flakecheck run` and `flakecheck.run_suite`.

prepare (settings, suite, model, the self-check, prompt lengths — before the first byte is written) -> replay
every (composition, repeat), each finished one saved under partial/ at once (Ctrl-C loses at most what is in
flight; `resume=True` continues) -> stop sequences, grading -> the shared finish (flakecheck.run.pipeline).
If report.html then fails to render, the run directory is still complete: `run_suite` raises
flakecheck.reports.finished.ReportError, whose `run` is the loaded run and whose message gives the
`flakecheck report` command that renders it again. With `grader=` (an argv list or a command string, see
flakecheck.grading.external) an external process grades the outputs instead of the suite's checks; if it
fails, the replayed outputs stay in partial/ and `resume=True` grades them again without replaying.
"""

from __future__ import annotations

import inspect
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from flakecheck.analysis.divergence import Thresholds
from flakecheck.analysis.verdicts import grade_run, memo_decode
from flakecheck.data.compositions import Composition
from flakecheck.data.input_format import encode_inputs, has_chat_template, resolve_inputs
from flakecheck.data.record import Computer
from flakecheck.data.rundir import RunData, RunDirectory
from flakecheck.data.stops import apply_stops
from flakecheck.data.suite import Suite, check_prompt_lengths, load_suite
from flakecheck.data.traces import Trace
from flakecheck.engine import LoadedModel, decode_tokens, encode_prompt, token_texts
from flakecheck.engine.loader import DEFAULT_MODEL
from flakecheck.engine.models import probe_dims, sharded_dims
from flakecheck.engine.spec import EngineSpec, resolve_engine
from flakecheck.errors import UserError
from flakecheck.grading.external import GraderSpec, grader_spec
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.kernels.tensor_parallel import TP_INVARIANT, check_size
from flakecheck.machine.device import peak_memory
from flakecheck.machine.fingerprint import in_force
from flakecheck.replay import CaseRequest, replay_runs
from flakecheck.replay.cluster import Cluster, ClusterSettings
from flakecheck.replay.row_share import RowStore
from flakecheck.run.adaptive_draws import AdaptiveDraws, add_stats
from flakecheck.run.options import RUN_OPTIONS, signature
from flakecheck.run.pipeline import (
    SourceRecord,
    TokenTexts,
    finish_run,
    interruptible,
    open_run_directory,
    render_report,
)
from flakecheck.run.progress import ReplayProgress
from flakecheck.run.settings import DRAWS_PER_ROUND, ROUNDS_PER_REPLAY, RunConfig


@dataclass(frozen=True)
class PreparedRun:
    """A validated run, ready to replay: its directory is begun, nothing else written."""

    config: RunConfig
    suite: Suite
    model: LoadedModel
    spec: EngineSpec
    requests: list[CaseRequest]
    directory: RunDirectory
    cluster: Cluster | None = None  # started; stopped when the run ends

    @property
    def work(self) -> list[tuple[Composition, int]]:
        """Every (composition, repeat), in replay order."""
        return [(c, r) for r in range(self.config.repeat) for c in self.config.compositions]

    def interruptible(self) -> Any:
        config = self.config
        return interruptible(self.directory, [(c.name, r) for c, r in self.work], "compositions",
                             config.resume_command(self.directory.path), note=" (with or without --ray)")


def run_suite(suite: str | Path | Suite, *, model: str | LoadedModel = DEFAULT_MODEL, resume: bool = False,
              progress: bool = False, **options: Any) -> RunData:
    """Replay `suite` under each composition and write a run directory; returns it loaded. The keywords are
    `flakecheck run`'s options, declared once in flakecheck/run/options.py (help(run_suite) lists them with
    their defaults); `model` may be a model loaded before (its dtype is the run's); `kernels` and `device` may
    be text or the values it parses to (a KernelPolicy, a Device); `compositions` a list of Compositions."""
    loaded = model if isinstance(model, LoadedModel) else None
    if loaded:
        options["dtype"] = str(loaded.dtype).removeprefix("torch.")
    config = RunConfig.parse(suite.path if isinstance(suite, Suite) else Path(suite),
                             model=loaded.spec if loaded else str(model), **options)
    return execute(config, model=loaded, suite=suite if isinstance(suite, Suite) else None, resume=resume,
                   progress=progress)


# help(run_suite) and an editor show every run option's keyword and default
run_suite.__signature__ = signature(  # type: ignore[attr-defined]
    [inspect.Parameter("suite", inspect.Parameter.POSITIONAL_OR_KEYWORD)],
    [o for o in RUN_OPTIONS if o.in_config or o.part == "call"], RunData)


def execute(config: RunConfig, *, model: LoadedModel | None = None, suite: Suite | None = None,
            resume: bool = False, progress: bool = False) -> RunData:
    started = time.perf_counter()
    prepared = prepare(config, model, suite, resume)
    timings: dict[str, Any] = {"load_s": time.perf_counter() - started}
    adaptive = _adaptive(prepared)
    try:
        with ReplayProgress(len(prepared.work) * len(prepared.requests), enabled=progress) as bar, \
                prepared.interruptible():
            if adaptive is None:
                traces, timings["replay_s"], replayed = replay_runs(
                    prepared.model, config.replay, prepared.spec, prepared.requests, prepared.work,
                    prepared.directory, resume, bar, prepared.cluster)
            else:
                traces, timings["replay_s"], replayed = _replay_rounds(prepared, adaptive, resume, bar)
    finally:
        if prepared.cluster is not None:
            prepared.cluster.stop()  # nothing left running, whatever happened
    if replayed.get("fallback") and progress:
        Console(stderr=True).print(f"[yellow]warning: {replayed['fallback']}[/yellow]")
    with prepared.interruptible():
        loaded = prepared.model
        decode = memo_decode(lambda ids: decode_tokens(loaded, ids))
        traces, stopped = apply_stops(traces, prepared.suite.cases, decode)  # cases with `stop` sequences
        texts = TokenTexts(lambda ids: stopped[tuple(ids)] if tuple(ids) in stopped else decode(ids),
                           token_texts(loaded))
        t0 = time.perf_counter()
        grader = GraderSpec(config.grader, config.grader_timeout) if config.grader else None
        verdicts = grade_run(traces, prepared.suite.cases, texts.decode, grader, prepared.directory.partial_dir,
                             config.resume_command(prepared.directory.path))
        timings["grading_s"] = time.perf_counter() - t0
        draws = config.draws if adaptive is None else tuple(adaptive.ran)
        run = finish_run(prepared.directory, prepared.suite, traces, config.reference,
                         Thresholds(config.gap_threshold, config.gap_window), texts,
                         _record(prepared, replayed, adaptive), timings, verdicts, draws=draws,
                         sampling=config.sampling.to_dict() if config.sampling else None, started=started)
    render_report(run, config.html)
    return run


def _adaptive(prepared: PreparedRun) -> AdaptiveDraws | None:
    config = prepared.config
    if config.auto is None or config.sampling is None:
        return None
    return AdaptiveDraws(config.auto, [(c, r) for r in range(config.repeat) for c in config.named],
                         config.sampling.draws, DRAWS_PER_ROUND, ROUNDS_PER_REPLAY, config.reference,
                         [r.case_id for r in prepared.requests], str(prepared.model.dtype).removeprefix("torch."),
                         {r.case_id: len(r.prompt_ids) for r in prepared.requests})


def _replay_rounds(prepared: PreparedRun, adaptive: AdaptiveDraws, resume: bool, bar: ReplayProgress
                   ) -> tuple[list[Trace], float, dict[str, Any]]:
    """`--sample auto`: each replay run (and saved) whole before the next is decided from it."""
    traces: list[Trace] = []
    seconds, stats = 0.0, {}
    # a row one replay computed is loaded, not computed, by a later replay (flakecheck/replay/row_share.py)
    store = RowStore.for_run()
    with RowStore.active(store):
        for replay in range(len(adaptive.schedule)):
            work = adaptive.work(replay)
            if not work:
                break
            got, took, info = replay_runs(prepared.model, prepared.config.replay, prepared.spec, prepared.requests,
                                          work, prepared.directory, resume, bar)
            adaptive.saw(got)
            adaptive.cost(took, info)
            traces += got
            seconds += took
            stats = add_stats(stats, info)
    stats["stored_rows"], stats["loaded_rows"] = store.stats.stored, store.stats.loaded
    return traces, seconds, stats


def prepare(config: RunConfig, model: LoadedModel | None = None, suite: Suite | None = None,
            resume: bool = False) -> PreparedRun:
    """Everything a run needs, checked before the first byte is written."""
    suite_obj = (suite if suite is not None else load_suite(config.suite)).select(list(config.ids) or None,
                                                                                  config.limit)
    if resume and config.out is None:
        raise UserError("--resume needs --out DIR (the interrupted run directory)")
    if config.grader:
        grader_spec(config.grader, config.grader_timeout)  # the program exists: fail before a long replay
    engine = config.engine
    loaded = model if model is not None else engine.load()
    spec = resolve_engine(engine, probe_dims(loaded.config))
    context = loaded.config.max_context
    requests = case_requests(config, suite_obj, loaded)
    prompt_lengths = {r.case_id: len(r.prompt_ids) for r in requests}
    check_prompt_lengths(suite_obj, lambda case: prompt_lengths[case.id], context, config.max_tokens)
    check_tensor_parallel(config.compositions, loaded, engine.policy)
    for comp in config.compositions:
        longest_filler = comp.fillers.prompt_len[1] + comp.fillers.output_len[1]
        if comp.fillers.count and longest_filler > context:
            raise UserError(f"composition '{comp.name}': fillers of up to {longest_filler} tokens exceed the "
                            f"model's context of {context}")
    cluster = None
    if config.ray is not None:  # unreachable: exit 2, nothing written
        cluster = Cluster(ClusterSettings(config.ray, config.workers, config.cpus_per_worker,
                                          config.allow_mixed_devices), engine)
        cluster.start()
    try:
        directory = open_run_directory(suite_obj, config.out, resume, _fingerprint(config, suite_obj, loaded, requests))
    except BaseException:
        if cluster is not None:
            cluster.stop()
        raise
    return PreparedRun(config.with_changes(out=directory.path), suite_obj, loaded, spec, requests, directory, cluster)


def check_tensor_parallel(compositions: Sequence[Composition], model: LoadedModel, policy: KernelPolicy) -> None:
    """UserError naming the composition and the model's dimension when its TP size cannot shard the model."""
    dims = sharded_dims(model.config)
    for comp in compositions:
        try:
            check_size(dims, comp.tp, tp_invariant=policy.matmul == TP_INVARIANT)
        except ValueError as err:
            raise UserError(f"composition '{comp.name}': {err}") from None


def case_requests(config: RunConfig, suite: Suite, model: LoadedModel) -> list[CaseRequest]:
    """Every case of `suite` as the engine sees it: the prompt's token ids under the run's input format, and
    its token limit."""
    prompt_ids, _ = encode_inputs(suite, config.input_format, has_chat_template(model.tokenizer),
                                  lambda prompt: encode_prompt(model, prompt))
    return [CaseRequest(c.id, prompt_ids[c.id], c.max_tokens or config.max_tokens) for c in suite.cases]


def _fingerprint(config: RunConfig, suite: Suite, model: LoadedModel, requests: list[CaseRequest]) -> dict[str, Any]:
    """What decides the traces: a resumed run must match it."""
    return {**config.trace_settings(), "model_path": str(model.path), "architecture": model.config.architecture,
            "suite_sha256": suite.sha256, "case_ids": [r.case_id for r in requests]}


def _record(prepared: PreparedRun, replayed: dict[str, Any], adaptive: AdaptiveDraws | None = None) -> SourceRecord:
    config, loaded, spec = prepared.config, prepared.model, prepared.spec
    engine = spec.to_dict()  # policy, backend, device, profile, the machine and what it verified
    ran = config.compositions if adaptive is None else \
        config.named + tuple(d for d in config.sampling.draws if d.name in adaptive.ran)  # type: ignore[union-attr]
    return SourceRecord(
        source="engine", model=config.engine.model, dtype=str(loaded.dtype).removeprefix("torch."),
        computer=Computer.of_engine(engine), compositions=[c.to_dict() for c in ran],
        command=config.command(), fixed_order_command=config.fixed_order_command(),
        details={
            "config": config.to_dict(), "model_path": str(loaded.path), "architecture": loaded.config.architecture,
            "engine": engine, "pinning": in_force(), "max_tokens": config.max_tokens, "repeat": config.repeat,
            # what was sent: the setting, whether the model has a chat template, how many went as chat / raw
            "input_format": resolve_inputs(prepared.suite, config.input_format,
                                           has_chat_template(loaded.tokenizer))[1].to_dict(),
            "grader": GraderSpec(config.grader, config.grader_timeout).to_dict() if config.grader else None,
            "platform": platform.platform(), "replay": replayed["mode"], "replay_stats": replayed,
            "adaptive": adaptive.summary() if adaptive is not None else None,
            "memory": peak_memory(config.engine.device),
        })

