"""The one pipeline every source of traces goes through — a replay through the built-in engine, a probe of a
server, imported harness logs:

    open the run directory (nothing written before every check passed) -> the source's work, each finished
    piece saved under partial/ (Ctrl-C: a RunInterrupted naming what was saved and the resume command)
    -> finish: analyse the traces, write the tables and the record (meta.json) once, drop partial/
    -> render report.html (a report that fails costs only itself: ReportError, the run kept)

A source hands `finish_run` its traces, how it turns token ids into text, its verdicts (graded before, or by
the suite's checks here), and its part of the record (`SourceRecord`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakecheck.analysis.divergence import Thresholds, analyse
from flakecheck.analysis.flip.predict import NoiseModel
from flakecheck.analysis.flip.summary import flip_meta
from flakecheck.analysis.verdicts import grade_traces
from flakecheck.data.record import Computer, RunRecord, finite_or_none, now
from flakecheck.data.rundir import RunData, RunDirectory, default_run_dir
from flakecheck.data.suite import Suite
from flakecheck.data.traces import Trace, VerdictKey, traces_digest
from flakecheck.errors import UserError
from flakecheck.grading.checks import check_label
from flakecheck.machine.fingerprint import software_versions
from flakecheck.reports.finished import write_report_html


class RunInterrupted(Exception):
    """Ctrl-C during a run or a probe: what finished is saved; the message says how to resume."""


@dataclass(frozen=True)
class TokenTexts:
    """How the source turns token ids into text: a whole output, and one token (for tables and reports)."""

    decode: Callable[[list[int]], str]
    token: Callable[[int], str]


@dataclass(frozen=True)
class SourceRecord:
    """What a source contributes to the run's record: who computed the traces and with which settings."""

    source: str  # engine | probe | import
    model: str
    dtype: str | None  # the logits' dtype; sizes one ulp for the flip kinds (None: a server that did not say)
    computer: Computer
    compositions: Sequence[Mapping[str, Any]]
    command: str | None
    fixed_order_command: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)  # the source's own blocks of meta.json


def open_run_directory(suite: Suite, out: Path | None, resume: bool, fingerprint: Mapping[str, Any]) -> RunDirectory:
    """The run's directory, begun: `out` (default reports/<suite>-<time>) must be new or empty, or, with
    `resume`, an interrupted run whose recorded fingerprint (what decides the traces) matches."""
    if resume and out is None:
        raise UserError("--resume needs --out DIR (the interrupted run directory)")
    directory = RunDirectory(out if out is not None else default_run_dir(suite.path))
    directory.begin(dict(fingerprint), resume)
    return directory


@contextlib.contextmanager
def interruptible(directory: RunDirectory, work: Sequence[tuple[str, int]], unit: str, resume_command: str,
                  note: str = "") -> Iterator[None]:
    """Ctrl-C becomes a RunInterrupted that says how many of the `work` (name, repeat) pieces — `unit`:
    compositions, load levels — were saved, and how to continue."""
    try:
        yield
    except KeyboardInterrupt:
        raise RunInterrupted(saved_message(directory, work, unit, resume_command, "interrupted", note)) from None


def saved_message(directory: RunDirectory, work: Sequence[tuple[str, int]], unit: str, resume_command: str,
                  what: str, note: str = "") -> str:
    finished = directory.n_saved(list(work))
    shards = len(list((directory.partial_dir / "shards").glob("*.parquet")))
    kept = f" and {shards} finished shards" if shards else ""
    return (f"{what}: {finished} of {len(work)} {unit}{kept} saved in {directory.partial_dir}; "
            f"continue with{note}: {resume_command}")


def finish_run(directory: RunDirectory, suite: Suite, traces: Sequence[Trace], reference: str,
               thresholds: Thresholds, texts: TokenTexts, source: SourceRecord, timings: dict[str, Any],
               verdicts: Mapping[VerdictKey, bool | None] | None = None, draws: Sequence[str] = (),
               sampling: Mapping[str, Any] | None = None, started: float | None = None,
               case_notes: Mapping[str, Mapping[str, Any]] | None = None, noise: NoiseModel | None = None,
               noise_source: Mapping[str, Any] | None = None) -> RunData:
    """Analyse the traces, write runs/tokens/cases parquet and the record (meta.json, once), drop the saved
    partial traces; returns the run loaded. `verdicts`: every trace's pass/fail, graded before (None: the
    suite's own checks grade here). `draws`: the compositions that are draws from a load, `sampling` how they
    were drawn. `timings` (the source's) gain grading_s, analysis_s, the token counts and — from `started` —
    total_s. `case_notes`: more metadata per case, for the record's case list. `noise`: the noise the predicted
    flip probabilities use instead of the run's own (a server's profile), `noise_source` what it is; the record
    says which noise predicted (`flip.noise_source`: the server's, this run's, or the simulated profile's)."""
    if verdicts is None:
        t0 = time.perf_counter()
        verdicts = grade_traces(traces, suite.cases, texts.decode)
        timings["grading_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = analyse(traces, suite.cases, reference, thresholds, texts.decode, texts.token, verdicts=verdicts,
                     dtype=source.dtype, draws=frozenset(draws), noise=noise)
    flip = flip_meta(tables.cases, tables.runs, reference, list(draws), tables.noise, sampling)
    flip["noise_source"] = dict(noise_source) if noise_source else _own_noise(source)
    timings["analysis_s"] = time.perf_counter() - t0
    directory.write_tables(tables.runs, tables.tokens, tables.cases)
    generated = sum(len(r["token_ids"]) for r in tables.runs)
    timings["generated_tokens"] = generated
    replay_s = timings.get("replay_s")
    timings["tokens_per_s"] = generated / replay_s if replay_s else None
    if started is not None:
        timings["total_s"] = time.perf_counter() - started
    notes = case_notes or {}
    record = RunRecord(
        source=source.source, model=source.model, dtype=source.dtype, computer=source.computer,
        reference=reference, compositions=tuple(dict(c) for c in source.compositions),
        gap_threshold=thresholds.gap_threshold, gap_window=thresholds.gap_window, suite=str(suite.path),
        suite_name=suite.path.stem, suite_sha256=suite.sha256, n_cases=len(suite.cases),
        cases=tuple({"case_id": c.id, "input": c.input, "targets": list(c.targets),
                     "checks": [check_label(k) for k in c.checks], "metadata": {**c.metadata, **notes.get(c.id, {})},
                     "line": c.line} for c in suite.cases),
        command=source.command, fixed_order_command=source.fixed_order_command, flip=flip,
        gap_noise=finite_or_none(tables.gap_noise), suite_warnings=tuple(suite.warnings), timings=timings,
        created_at=now(), details={**source.details, "traces_digest": traces_digest(traces),  # equal: same bits
                                   "versions": software_versions()},
    )
    directory.write_meta(record.to_dict())
    directory.finish()
    return directory.load()


def _own_noise(source: SourceRecord) -> dict[str, Any]:
    """What the run's own measured noise stands for: the simulated kernels of a profile (the built-in engine), or
    the server or harness runs the traces came from."""
    if source.source == "engine":
        return {"source": "simulation", "profile": source.computer.profile, "policy": source.computer.policy}
    return {"source": "run"}


def render_report(run: RunData, html: bool) -> None:
    """report.html beside the finished run (when asked); a failure raises ReportError, the run kept."""
    if html:
        error = write_report_html(run, RunDirectory(run.path).html_path)
        if error is not None:
            raise error
