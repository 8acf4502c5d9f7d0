"""Two or more runs of one task as a run directory: the logs are the compositions (the first, or
--reference, is the reference), a sample's epochs its repeats, the harness's own verdicts the verdicts; the
shared analysis (flakecheck.run.pipeline.finish_run) finds first divergences, statuses, score swing and flip kinds.

A sample becomes a case only when every log has it, unerrored, with the request the reference sent (the same
messages or prompt, max_tokens and stop); every other sample is listed with the reason, in the warnings and
in meta.json (`import.skipped`). Everything is checked and analysed in a temporary directory beside the
target, which is renamed into place only when complete: an error or Ctrl-C leaves nothing behind."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.divergence import Thresholds
from flakecheck.data.record import Computer
from flakecheck.data.rundir import RunData, load_run
from flakecheck.data.suite import Suite, load_suite
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError
from flakecheck.harness.model import HarnessLog, SampleRun
from flakecheck.harness.scorers import ScorerMapping
from flakecheck.harness.to_suite import case_line, replayable, write_suite
from flakecheck.harness.traces import sample_trace
from flakecheck.probe.conformance.noise import ServerNoise
from flakecheck.probe.vocab import Vocab
from flakecheck.run.pipeline import SourceRecord, TokenTexts, finish_run, open_run_directory, render_report


@dataclass
class ImportPlan:
    """What the import will write, decided before anything is."""

    logs: list[HarnessLog]  # the reference first
    names: list[str]  # composition name per log
    cases: dict[str, list[list[SampleRun]]]  # sample id -> per log, its epochs
    skipped: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def composition_names(logs: Sequence[HarnessLog], given: Sequence[str] | None = None) -> list[str]:
    """`c<connections>` when each log's concurrency is known and distinct, else the file stems (numbered when
    they repeat); `given` (--names) overrides."""
    if given:
        names = [n.strip() for n in given]
        if len(names) != len(logs) or not all(names):
            raise UserError(f"--names: give one name per log ({len(logs)}), comma-separated")
    else:
        levels = [log.concurrency for log in logs]
        if all(levels) and len(set(levels)) == len(levels):
            names = [f"c{n}" for n in levels]
        else:
            names = [re.sub(r"[^A-Za-z0-9._-]+", "-", log.path.stem)[:60] or "log" for log in logs]
            seen: dict[str, int] = {}
            for i, name in enumerate(names):
                seen[name] = seen.get(name, 0) + 1
                if names.count(name) > 1:
                    names[i] = f"{name}-{seen[name]}"
    if len(set(names)) != len(names):
        raise UserError(f"--names: the names must differ, got {', '.join(names)}")
    return names


def reference_index(logs: Sequence[HarnessLog], names: Sequence[str], reference: str | None) -> int:
    if reference is None:
        return 0
    for i, (log, name) in enumerate(zip(logs, names)):
        if reference in (name, str(log.path), log.path.name):
            return i
    raise UserError(f"--reference {reference}: not one of the logs ({', '.join(names)})")


def plan_import(logs: Sequence[HarnessLog], names: Sequence[str], reference: int) -> ImportPlan:
    order = [reference] + [i for i in range(len(logs)) if i != reference]
    plan = ImportPlan([logs[i] for i in order], [names[i] for i in order], {})
    first = plan.logs[0]
    for log in plan.logs[1:]:
        if log.task != first.task:
            plan.warnings.append(f"the logs are of different tasks ({first.task} in {first.path}, {log.task} in "
                                 f"{log.path}): samples are matched by id and compared only where the requests agree")
        if log.model != first.model:
            plan.warnings.append(f"the logs are of different models ({first.model}, {log.model} in {log.path}): "
                                 "their answers differ for more reasons than batch composition")
    kept = []
    for log in plan.logs:
        samples, skipped = replayable(log)
        kept.append(samples)
        plan.skipped.extend(skipped)
    for sample_id, ref_runs in kept[0].items():
        per_log, reason = [ref_runs], None
        for log, samples in zip(plan.logs[1:], kept[1:]):
            runs = samples.get(sample_id)
            if runs is None:
                if not any(s.sample_id == sample_id for s in log.samples):
                    reason = f"missing from {log.path}"
                    plan.skipped.append({"sample_id": sample_id, "log": str(log.path), "reason": "missing"})
                else:
                    reason = f"not comparable in {log.path}"
                break
            if runs[0].request.key() != ref_runs[0].request.key():  # type: ignore[union-attr]
                reason = f"sent a different request in {log.path}"
                plan.skipped.append({"sample_id": sample_id, "log": str(log.path), "reason": reason})
                break
            per_log.append(runs)
        if reason is None:
            plan.cases[sample_id] = per_log
    reference_ids = {s.sample_id for s in first.samples}
    for sample_id in sorted({i for samples in kept[1:] for i in samples} - reference_ids):
        plan.skipped.append({"sample_id": sample_id, "log": str(first.path), "reason": "missing"})
    if not plan.cases:
        raise UserError("no sample can be compared across the logs (see the warnings above): nothing to write")
    return plan


def build_traces(plan: ImportPlan) -> tuple[list[Trace], dict[tuple[str, str, int], bool | None],
                                            dict[tuple[int, ...], str], dict[str, str], Vocab]:
    """Traces in composition order, the harness's verdicts, the answer text per token sequence, how each case
    is compared (token | text), and the vocabulary of run-local token ids."""
    vocab = Vocab()
    units = {sample_id: "token" if all(r.steps is not None for runs in per_log for r in runs) else "text"
             for sample_id, per_log in plan.cases.items()}
    traces: list[Trace] = []
    verdicts: dict[tuple[str, str, int], bool | None] = {}
    texts: dict[tuple[int, ...], str] = {}
    for position, name in enumerate(plan.names):
        for sample_id, per_log in plan.cases.items():
            for repeat, run in enumerate(sorted(per_log[position], key=lambda r: r.epoch)):
                trace = sample_trace(run, name, repeat, vocab, units[sample_id] == "token")
                traces.append(trace)
                verdicts[(sample_id, name, repeat)] = run.passed
                texts.setdefault(tuple(trace.token_ids), run.output)
    return traces, verdicts, texts, units, vocab


def write_import_run(plan: ImportPlan, mapping: ScorerMapping, out: Path, *, suite_out: Path | None,
                     thresholds: Thresholds, dtype: str | None, command: str, html: bool,
                     reader: str, noise: ServerNoise | None = None, noise_in_flight: int | None = None,
                     line_of: Callable[[HarnessLog, list[SampleRun]], dict[str, Any]] | None = None) -> RunData:
    """Write the run directory (and the suite, when asked) and return the run loaded from `out`. `noise`: a
    server's measured profile the predicted flip probabilities come from (what one log alone can have), for
    a load of at most `noise_in_flight` requests in flight (None: the largest load it measured). `line_of`: a
    case's suite line from the reference log's runs (default: to_suite.case_line with `mapping`'s checks)."""
    check_out(out)
    ref = plan.logs[0]
    line_of = line_of or (lambda log, runs: case_line(log, runs, mapping))
    lines = [line_of(ref, per_log[0]) for per_log in plan.cases.values()]
    traces, verdicts, texts, units, vocab = build_traces(plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        suite = _suite(lines, work, suite_out or Path(f"{ref.task}.jsonl"))
        directory = open_run_directory(suite, work / "run", False,
                                       {"source": "import", "logs": [str(log.path) for log in plan.logs]})
        decode_units = TokenTexts(lambda ids: texts[tuple(ids)] if tuple(ids) in texts else vocab.decode(ids),
                                  vocab.text)
        # gap noise is measured on logprobs: none (null) when every case compares by text
        finish_run(directory, suite, traces, plan.names[0], thresholds, decode_units,
                   _record(plan, mapping, units, dtype, command, reader), {}, verdicts,
                   case_notes={case_id: {"divergence_by": unit} for case_id, unit in units.items()},
                   **({"noise": noise.model(noise_in_flight), "noise_source": noise.describe(noise_in_flight, False)}
                      if noise is not None else {}))
        if suite_out is not None:
            write_suite(suite_out, lines)
        if out.is_dir():
            out.rmdir()  # check_out allowed only an empty directory
        (work / "run").rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loaded = load_run(out)
    render_report(loaded, html)  # as `flakecheck run`: the run directory is complete first
    return loaded


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: already exists and is not empty (choose another --out)")


def _suite(lines: list[dict[str, Any]], work: Path, path: Path) -> Suite:
    """The cases as flakecheck reads them: written and loaded back, so the run describes exactly the suite
    --suite writes (and a line flakecheck would refuse never gets that far)."""
    staged = work / "suite.jsonl"
    write_suite(staged, lines)
    return replace(load_suite(staged), path=path)


def _record(plan: ImportPlan, mapping: ScorerMapping, units: dict[str, str], dtype: str | None, command: str,
            reader: str) -> SourceRecord:
    ref = plan.logs[0]
    by = " and ".join(sorted(set(units.values())))
    compositions = [
        {"name": name, "log": str(log.path), "harness": log.harness, "task": log.task, "model": log.model,
         "concurrency": log.concurrency, "epochs": log.epochs, "created": log.created, "status": log.status}
        for name, log in zip(plan.names, plan.logs)
    ]
    imported = {
        "harness": ref.harness, "task": ref.task, "reader": reader, "reference": plan.names[0],
        "logs": [str(log.path) for log in plan.logs], "versions": ref.versions,
        "scorer": mapping.to_dict(), "other_scorers": ref.other_scorers,
        "divergence_by": {unit: sum(u == unit for u in units.values()) for unit in ("token", "text")},
        "skipped": plan.skipped, "warnings": plan.warnings + [w for log in plan.logs for w in log.warnings],
    }
    return SourceRecord(
        source="import", model=ref.model, dtype=dtype, computer=Computer.server(f"{ref.harness} logs, divergence "
                                                                                f"by {by}"),
        compositions=compositions, command=command,
        details={"max_tokens": None, "repeat": max(log.epochs for log in plan.logs),
                 "device": {"type": "server", "endpoint": "unknown (imported logs)"}, "import": imported})
