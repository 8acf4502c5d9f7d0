"""The Python API the CLI is a thin layer over.

    run = flakecheck.run_suite("suites/demo.jsonl", kernels="splitk", limit=20)
    run.cases[run.cases.status != "stable"]
    flakecheck.load_run(run.path).runs

A run is plan -> replay -> analyse -> write: `prepare` checks everything (settings, suite, model,
prompt lengths) before the first byte is written; the replay saves each finished composition under
partial/ at once (Ctrl-C loses at most what is in flight, `resume=True` continues); `write_run`
analyses the traces and writes the run directory. If report.html then fails to render, the run
directory is still complete: `run_suite` raises flakecheck.reports.finished.ReportError, whose `run`
is the loaded run and whose message gives the `flakecheck report` command that renders it again.
With `grader=` (an argv list or a command string, see flakecheck.grading.external) an external process grades
the outputs instead of the suite's checks; if it fails, the replayed outputs stay in partial/ and
`resume=True` grades them again without replaying.
"""

from __future__ import annotations

import contextlib
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakecheck.analysis.divergence import Thresholds
from flakecheck.analysis.verdicts import grade_run, memo_decode
from flakecheck.data.compositions import REFERENCE, Composition, resolve_compositions
from flakecheck.data.input_format import encode_inputs, has_chat_template, resolve_inputs
from flakecheck.data.rundir import RunData, RunDirectory, default_run_dir, load_run
from flakecheck.data.stops import apply_stops
from flakecheck.data.suite import Suite, check_prompt_lengths, load_suite
from flakecheck.engine import LoadedModel, decode_tokens, encode_prompt, load_model, token_texts
from flakecheck.engine.spec import EngineSpec, resolve_engine
from flakecheck.errors import UserError
from flakecheck.grading.external import GraderSpec, grader_spec
from flakecheck.machine.probes import ProbeDims
from flakecheck.replay import CaseRequest, replay_runs
from flakecheck.reports.finished import ReportError, show_finished_run, write_report_html
from flakecheck.run.pipeline import TokenTexts, write_run
from flakecheck.run.settings import RunConfig, config_from_options, parse_ids

if TYPE_CHECKING:
    from flakecheck.replay.cluster import Cluster


class RunInterrupted(Exception):
    """Ctrl-C during a run: finished compositions are saved; the message says how to resume."""


@dataclass(frozen=True)
class PreparedRun:
    """A validated run, ready to replay: nothing has been written yet."""

    config: RunConfig
    suite: Suite
    model: LoadedModel
    spec: EngineSpec
    requests: list[CaseRequest]
    directory: RunDirectory
    cluster: Cluster | None = None  # started; stopped when the run ends


def run_suite(
    suite: str | Path | Suite,
    *,
    model: str | LoadedModel = "smollm2",
    compositions: Sequence[Composition] | None = None,
    ids: Sequence[str] | None = None,
    resume: bool = False,
    progress: bool = False,
    **options: Any,
) -> RunData:
    """Replay `suite` under each composition and write a run directory; returns it loaded.

    Options are RunConfig's fields: dtype, kernels, backend, profile, max_tokens, gap_threshold,
    gap_window, repeat, limit, out, html, replay, input_format."""
    suite_path = suite.path if isinstance(suite, Suite) else Path(suite)
    spec = model.spec if isinstance(model, LoadedModel) else model
    config = config_from_options(suite_path, compositions, model=spec, ids=ids, **options)
    return execute(config, model=model if isinstance(model, LoadedModel) else None,
                   suite=suite if isinstance(suite, Suite) else None, resume=resume, progress=progress)


def execute(config: RunConfig, *, model: LoadedModel | None = None, suite: Suite | None = None,
            resume: bool = False, progress: bool = False) -> RunData:
    started = time.perf_counter()
    prepared = prepare(config, model, suite, resume)
    timings = {"load_s": time.perf_counter() - started}
    try:
        traces, timings["replay_s"], replayed = _replay(prepared, resume, progress)
    finally:
        if prepared.cluster is not None:
            prepared.cluster.stop()  # nothing left running, whatever happened
    if replayed.get("fallback") and progress:
        from rich.console import Console

        Console(stderr=True).print(f"[yellow]warning: {replayed['fallback']}[/yellow]")
    with _interruptible(prepared):
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
        run = write_run(prepared.directory, prepared.suite, traces, config.compositions[0].name,
                        Thresholds(config.gap_threshold, config.gap_window), texts,
                        {**_meta(prepared), "replay": replayed["mode"], "replay_stats": replayed}, timings, verdicts,
                        draws=config.drawn, sampling=config.sampling())
    report_error = write_report_html(run, prepared.directory.html_path) if config.html else None
    timings["total_s"] = time.perf_counter() - started
    run.meta["timings"] = timings
    prepared.directory.write_meta(run.meta)
    if report_error is not None:
        raise report_error  # the run directory is complete; the error carries the run and the rerender command
    return run


def prepare(config: RunConfig, model: LoadedModel | None = None, suite: Suite | None = None,
            resume: bool = False) -> PreparedRun:
    """Everything a run needs, checked before the first byte is written."""
    suite_obj = suite if suite is not None else load_suite(config.suite)
    suite_obj = suite_obj.select(list(config.ids) or None, config.limit)
    if resume and config.out is None:
        raise UserError("--resume needs --out DIR (the interrupted run directory)")
    if config.grader:
        grader_spec(config.grader, config.grader_timeout)  # the program exists: fail before a long replay
    loaded = model if model is not None else load_model(config.model, config.dtype)
    spec = resolve_engine(config.kernels, ProbeDims.of(loaded.config), backend=config.backend,
                          profile=config.profile, dtype=config.dtype)
    context = loaded.config.max_context
    requests = case_requests(config, suite_obj, loaded)
    prompt_lengths = {r.case_id: len(r.prompt_ids) for r in requests}
    check_prompt_lengths(suite_obj, lambda case: prompt_lengths[case.id], context, config.max_tokens)
    for comp in config.compositions:
        longest_filler = comp.fillers.prompt_len[1] + comp.fillers.output_len[1]
        if comp.fillers.count and longest_filler > context:
            raise UserError(f"composition '{comp.name}': fillers of up to {longest_filler} tokens exceed the "
                            f"model's context of {context}")
    out = config.out if config.out is not None else default_run_dir(suite_obj.path)
    config = config.with_changes(out=out)
    directory = RunDirectory(out)
    cluster = _cluster(config) if config.ray is not None else None  # unreachable: exit 2, nothing written
    try:
        directory.begin(_fingerprint(config, suite_obj, loaded, requests), resume)
    except BaseException:
        if cluster is not None:
            cluster.stop()
        raise
    return PreparedRun(config, suite_obj, loaded, spec, requests, directory, cluster)


def _cluster(config: RunConfig) -> Cluster:
    from flakecheck.replay.cluster import Cluster, ClusterSettings, EngineSettings

    assert config.ray is not None
    cluster = Cluster(ClusterSettings(config.ray, config.workers, config.cpus_per_worker, config.allow_mixed_devices),
                      EngineSettings(config.model, config.dtype, config.kernels.name, config.backend, config.profile))
    cluster.start()
    return cluster


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


def _replay(prepared: PreparedRun, resume: bool, show_progress: bool) -> tuple[list, float, dict[str, Any]]:
    from flakecheck.run.progress import ReplayProgress

    config, directory = prepared.config, prepared.directory
    work = [(c, r) for r in range(config.repeat) for c in config.compositions]
    with ReplayProgress(len(work) * len(prepared.requests), enabled=show_progress) as bar, \
            _interruptible(prepared):
        return replay_runs(prepared.model, config, prepared.spec, prepared.requests, work, directory, resume, bar,
                           prepared.cluster)


@contextlib.contextmanager
def _interruptible(prepared: PreparedRun) -> Iterator[None]:
    """Ctrl-C becomes a RunInterrupted that says what was saved and how to continue."""
    try:
        yield
    except KeyboardInterrupt:
        config = prepared.config
        work = [(c.name, r) for r in range(config.repeat) for c in config.compositions]
        finished = prepared.directory.n_saved(work)
        shards = len(list((prepared.directory.partial_dir / "shards").glob("*.parquet")))
        kept = f" and {shards} finished shards" if shards else ""
        assert config.out is not None
        raise RunInterrupted(
            f"interrupted: {finished} of {len(work)} compositions{kept} saved in {prepared.directory.partial_dir}; "
            f"continue with (with or without --ray): {config.resume_command(config.out)}"
        ) from None


def _meta(prepared: PreparedRun) -> dict[str, Any]:
    from flakecheck.machine.fingerprint import in_force

    config, loaded = prepared.config, prepared.model
    return {
        "source": "engine",
        "config": config.to_dict(),
        "command": config.command(),
        "model": config.model,
        "model_path": str(loaded.path),
        "architecture": loaded.config.architecture,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "engine": prepared.spec.to_dict(),  # policy, backend, device, profile, the machine and what it verified
        "pinning": in_force(),
        "max_tokens": config.max_tokens,
        "repeat": config.repeat,
        "compositions": [c.to_dict() for c in config.compositions],
        # what was sent: the setting, whether the model has a chat template, how many cases went as chat / raw
        "input_format": resolve_inputs(prepared.suite, config.input_format,
                                       has_chat_template(loaded.tokenizer))[1].to_dict(),
        "grader": GraderSpec(config.grader, config.grader_timeout).to_dict() if config.grader else None,
        "platform": platform.platform(),
    }


def run_from_cli(*, suite: Path, compositions_file: Path | None, composition_specs: list[str], ids: str | None,
                 quiet: bool, resume: bool, sample_only: bool = False, **options: Any) -> None:
    """`flakecheck run`: the API call, a progress bar, then the terminal summary."""
    from rich.console import Console

    compositions = resolve_compositions(compositions_file, composition_specs)
    if sample_only:
        if not options.get("sample"):
            raise UserError("--sample-only needs --sample N (the compositions to draw)")
        compositions = compositions[:1]  # the reference alone beside the draws
    config = config_from_options(suite, compositions, ids=parse_ids(ids), **options)
    try:
        run = execute(config, resume=resume, progress=not quiet)
    except RunInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{exc}[/yellow]")
        sys.exit(130)
    except ReportError as exc:
        show_finished_run(exc.run, quiet, exc)
    else:
        show_finished_run(run, quiet)


__all__ = ["REFERENCE", "RunConfig", "RunData", "RunInterrupted", "execute", "load_run", "run_suite"]
