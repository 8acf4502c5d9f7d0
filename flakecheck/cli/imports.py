"""`flakecheck import inspect LOG...` and `flakecheck import lm-eval SAMPLES.jsonl...`: harness runs as a suite
(--suite) and, with two or more runs of one task, as a run directory (--out).

The readers and the analysis are imported inside the commands, as cli.py does: the CLI is loaded for every
command, and pandas and pyarrow would add seconds to each."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from flakecheck.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from flakecheck.analysis.divergence import Thresholds
    from flakecheck.harness.model import HarnessLog

MAX_WARNING_LINES = 20

import_app = typer.Typer(no_args_is_help=True, help="Import eval-harness runs (inspect_ai, lm-evaluation-harness, "
                         "promptfoo): "
                         "their exact requests as a suite, two or more runs of a task as a run directory.\n\n"
                         "Example: flakecheck import inspect logs/c1.eval logs/c16.eval --out reports/quick")

SUITE_HELP = "write the requests as a suite here (replay it with `flakecheck run` or `probe`)"
OUT_HELP = "write a run directory comparing the logs (two or more of one task)"
REFERENCE_HELP = "the reference log: its composition name or path (default: the first log)"
NAMES_HELP = "composition names, one per log, comma-separated (default c<connections>, else the file names)"
NOISE_HELP = ("a `flakecheck conformance` directory of the server the logs came from: predict each case's flip "
              "probability from its measured noise (one log is then enough for --out)")
NOISE_IN_FLIGHT_HELP = "--noise: the requests in flight to predict for (default: the largest load the profile measured)"


@import_app.command("inspect", help="inspect_ai logs (.eval or .json) -> a suite and/or a run directory.\n\n"
                    "Example: flakecheck import inspect logs/a.eval logs/b.eval --out reports/quick "
                    "--suite quick.jsonl")
def inspect_command(
    logs: list[Path] = typer.Argument(..., help="inspect_ai logs of one task (run with --logprobs --top-logprobs 2 "
                                      "to compare by token)"),
    suite: Path | None = typer.Option(None, help=SUITE_HELP),
    out: Path | None = typer.Option(None, help=OUT_HELP),
    reference: str | None = typer.Option(None, help=REFERENCE_HELP),
    names: str | None = typer.Option(None, help=NAMES_HELP),
    scorer: str | None = typer.Option(None, help="whose verdicts to record (default: the task's first scorer)"),
    dtype: str | None = typer.Option(None, help="the server's logits dtype, which sizes a tie for the flip kinds"),
    gap_threshold: float = typer.Option(0.05, help="a top1-top2 logprob gap below this is a near-tie"),
    gap_window: int = typer.Option(50, help="near-ties count within the first N tokens of the reference"),
    no_html: bool = typer.Option(False, "--no-html", help="skip report.html"),
    quiet: bool = typer.Option(False, help="print only the summary line"),
    inspect_reader: bool = typer.Option(True, help="read through inspect_ai's own reader when it is installed"),
    noise: Path | None = typer.Option(None, help=NOISE_HELP),
    noise_in_flight: int | None = typer.Option(None, help=NOISE_IN_FLIGHT_HELP),
) -> None:
    from flakecheck.analysis.divergence import Thresholds
    from flakecheck.harness.inspect_log import inspect_ai_version, read_inspect_log
    from flakecheck.harness.inspect_samples import parse_inspect_log

    version = inspect_ai_version() if inspect_reader else None
    reader = f"inspect_ai {version}" if version else "flakecheck (inspect_ai's documented log format)"

    def read(path: Path) -> HarnessLog:
        return parse_inspect_log(read_inspect_log(path, use_inspect_ai=inspect_reader), path, scorer)

    _import(logs, read, suite, out, reference, names, dtype, Thresholds(gap_threshold, gap_window), not no_html,
            quiet, reader, noise, noise_in_flight)


@import_app.command("lm-eval", help="lm-evaluation-harness samples files (--log_samples: samples_<task>_<time>.jsonl) "
                    "-> a suite and/or a run directory.\n\nExample: flakecheck import lm-eval "
                    "out1/model/samples_task_2026.jsonl out8/model/samples_task_2026.jsonl --out reports/task")
def lmeval_command(
    samples: list[Path] = typer.Argument(..., help="lm-eval samples files of one task (the results_*.json beside "
                                         "each is read too)"),
    suite: Path | None = typer.Option(None, help=SUITE_HELP),
    out: Path | None = typer.Option(None, help=OUT_HELP),
    reference: str | None = typer.Option(None, help=REFERENCE_HELP),
    names: str | None = typer.Option(None, help=NAMES_HELP),
    scorer: str | None = typer.Option(None, help="the metric whose values are the verdicts (default: the first)"),
    filter: str | None = typer.Option(None, "--filter", help="the filter pipeline whose verdicts to record "
                                      "(default: the first in the file)"),
    dtype: str | None = typer.Option(None, help="the server's logits dtype, which sizes a tie for the flip kinds"),
    gap_threshold: float = typer.Option(0.05, help="a top1-top2 logprob gap below this is a near-tie"),
    gap_window: int = typer.Option(50, help="near-ties count within the first N tokens of the reference"),
    no_html: bool = typer.Option(False, "--no-html", help="skip report.html"),
    quiet: bool = typer.Option(False, help="print only the summary line"),
    noise: Path | None = typer.Option(None, help=NOISE_HELP),
    noise_in_flight: int | None = typer.Option(None, help=NOISE_IN_FLIGHT_HELP),
) -> None:
    from flakecheck.analysis.divergence import Thresholds
    from flakecheck.harness.lmeval_samples import read_lmeval_samples

    def read(path: Path) -> HarnessLog:
        return read_lmeval_samples(path, scorer, filter)

    _import(samples, read, suite, out, reference, names, dtype, Thresholds(gap_threshold, gap_window), not no_html,
            quiet, "flakecheck (lm-eval's samples format)", noise, noise_in_flight)


def _import(paths: list[Path], read: Callable[[Path], HarnessLog], suite: Path | None, out: Path | None,
            reference: str | None, names: str | None, dtype: str | None, thresholds: Thresholds, html: bool,
            quiet: bool, reader: str, noise: Path | None = None, noise_in_flight: int | None = None,
            promptfoo: bool = False) -> None:
    from rich.console import Console
    from rich.markup import escape

    from flakecheck.harness.scorers import map_scorer
    from flakecheck.harness.to_run import (
        check_out,
        composition_names,
        plan_import,
        reference_index,
        write_import_run,
    )
    from flakecheck.harness.to_suite import suite_lines, write_suite

    if suite is None and out is None:
        raise UserError("nothing to write: give --suite FILE (the requests as a suite) and/or --out DIR (a run "
                        "directory comparing two or more logs)")
    # one promptfoo file run with --repeat N compares its repeats
    if out is not None and len(paths) < 2 and noise is None and not promptfoo:
        raise UserError("--out compares runs: give two or more logs of one task (e.g. at 1 and 16 connections), or "
                        "one log and --noise DIR (the server's conformance directory) to predict from")
    if noise_in_flight is not None and (noise is None or noise_in_flight < 1):
        raise UserError("--noise-in-flight needs --noise DIR and an integer >= 1")
    profile = None
    if noise is not None:
        from flakecheck.probe.conformance.noise import ServerNoise

        profile = ServerNoise.load(noise)
    if dtype is not None:
        from flakecheck.analysis.flip_kind import dtype_name

        try:
            dtype = dtype_name(dtype)
        except ValueError as exc:
            raise UserError(f"--dtype: {exc}") from None
    if out is not None:
        check_out(out)
    logs = [read(path) for path in paths]  # every file is checked before anything is written
    given = names.split(",") if names else None
    labels = composition_names(logs, given)
    index = reference_index(logs, labels, reference)
    line_of = None
    if promptfoo:
        from flakecheck.harness import promptfoo_results

        promptfoo_results.check_same_config(logs)
        mapping, line_of = promptfoo_results.MAPPING, promptfoo_results.case_line
    else:
        mapping = map_scorer(logs[index])
    err = Console(stderr=True)
    command = shlex.join(["flakecheck", *sys.argv[1:]])
    if out is None:
        lines, skipped = suite_lines(logs[index], mapping, line_of=line_of)
        if not lines:
            raise UserError(f"{logs[index].path}: no sample can be replayed (see the warnings): nothing to write")
        _warn(err, [w for log in logs for w in log.warnings], skipped)
        assert suite is not None
        write_suite(suite, lines)
        print(f"{suite}: {len(lines)} cases from {logs[index].path} ({logs[index].harness}, task {logs[index].task}); "
              f"scorer {mapping.scorer or 'none'}: {mapping.note}")
        return
    plan = plan_import(logs, labels, index)
    _warn(err, plan.warnings + [w for log in plan.logs for w in log.warnings], plan.skipped)
    from flakecheck.reports.finished import ReportError, show_finished_run

    try:
        run = write_import_run(plan, mapping, out, suite_out=suite, thresholds=thresholds, dtype=dtype,
                               command=command, html=html, reader=reader, noise=profile,
                               noise_in_flight=noise_in_flight, line_of=line_of)
    except ReportError as exc:
        show_finished_run(exc.run, quiet, exc)
        return
    info = run.meta["import"]
    by = ", ".join(f"{n} by {unit}" for unit, n in info["divergence_by"].items() if n)
    line = (f"imported {len(plan.logs)} {plan.logs[0].harness} runs of task {plan.logs[0].task} "
            f"({', '.join(plan.names)}; reference {plan.names[0]}): {len(plan.cases)} cases compared ({by}), "
            f"{len({s['sample_id'] for s in plan.skipped})} left out; verdicts of scorer "
            f"{mapping.scorer or 'none'} ({mapping.note})" + (f"; suite: {suite}" if suite else ""))
    if quiet:
        from flakecheck.reports.terminal import summary_line

        print(summary_line(run))
        return
    from flakecheck.console import output_console

    console = output_console()
    console.print(escape(line), soft_wrap=True)
    show_finished_run(run, quiet=False)


@import_app.command("promptfoo", help="promptfoo `eval -o results.json` outputs of one config (repeats; runs at "
                    "several --max-concurrency) -> a suite and/or a run directory, with promptfoo's own pass/fail as "
                    "the verdicts.\n\nExample: flakecheck import promptfoo c1.json c8.json --record record.jsonl "
                    "--out reports/pf")
def promptfoo_command(
    results: list[Path] = typer.Argument(..., help="promptfoo results files (promptfoo eval --repeat N -o FILE.json)"),
    record: Path | None = typer.Option(None, help="the `flakecheck serve --record-responses` file of the server the "
                                       "evals ran against: tokens and top-2 logprobs (without it only text "
                                       "divergences are known)"),
    suite: Path | None = typer.Option(None, help=SUITE_HELP),
    out: Path | None = typer.Option(None, help=OUT_HELP),
    reference: str | None = typer.Option(None, help=REFERENCE_HELP),
    names: str | None = typer.Option(None, help=NAMES_HELP),
    dtype: str | None = typer.Option(None, help="the server's logits dtype, which sizes a tie for the flip kinds"),
    gap_threshold: float = typer.Option(0.05, help="a top1-top2 logprob gap below this is a near-tie"),
    gap_window: int = typer.Option(50, help="near-ties count within the first N tokens of the reference"),
    no_html: bool = typer.Option(False, "--no-html", help="skip report.html"),
    quiet: bool = typer.Option(False, help="print only the summary line"),
) -> None:
    from flakecheck.analysis.divergence import Thresholds
    from flakecheck.harness.promptfoo_results import RecordedAnswers, read_promptfoo_results

    pool = RecordedAnswers(record) if record is not None else None

    def read(path: Path) -> HarnessLog:
        return read_promptfoo_results(path, pool)

    _import(results, read, suite, out, reference, names, dtype, Thresholds(gap_threshold, gap_window), not no_html,
            quiet, "flakecheck (promptfoo's results format 3)" + (f", tokens from {record}" if record else ""),
            promptfoo=True)


def _warn(console: Console, warnings: list[str], skipped: list[dict[str, str]]) -> None:
    from rich.markup import escape

    lines = list(dict.fromkeys(warnings)) + [f"sample {s['sample_id']} left out ({s['log']}): {s['reason']}"
                                             for s in skipped]
    for line in lines[:MAX_WARNING_LINES]:
        console.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
    if len(lines) > MAX_WARNING_LINES:
        console.print(f"[yellow]warning:[/] {len(lines) - MAX_WARNING_LINES} more (meta.json: import.skipped, "
                      "import.warnings)")
