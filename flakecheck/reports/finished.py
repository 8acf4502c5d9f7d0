"""The end of `flakecheck run`: show the finished run, and never let a report that fails to render cost it.

By the time anything renders, the run directory is complete (tables, meta.json) and loadable. A failure
while writing report.html, or while printing the terminal summary, is then reported as one clear error
naming the run directory and the `flakecheck report` command that renders it again, with exit status 3
(a report flakecheck was asked for is missing, and that is flakecheck's fault, not the input's; the run
itself is kept and `flakecheck report` / `flakecheck gate` work on it).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flakecheck.console import output_console
from flakecheck.data.rundir import RunData
from flakecheck.reports import html as html_report
from flakecheck.reports import terminal
from flakecheck.reports.facts import empty_answer_warning, gather

EXIT_REPORT_FAILED = 3


def rerender_command(run_dir: Path, html: Path | None = None) -> str:
    """The command that renders a run directory's summary again (and its HTML report, when given)."""
    argv = ["flakecheck", "report", str(run_dir)]
    return shlex.join(argv + (["--html", str(html)] if html is not None else []))


class ReportError(Exception):
    """A report of a finished, complete run could not be rendered; `run` is the loaded run."""

    exit_code = EXIT_REPORT_FAILED

    def __init__(self, run: RunData, report: Path, cause: BaseException) -> None:
        self.run, self.report, self.cause = run, report, cause
        what = "written" if isinstance(cause, OSError) else "rendered (a flakecheck bug; please report it)"
        super().__init__(
            f"the run finished and its directory {run.path} is complete, but {report} could not be {what}: "
            f"{type(cause).__name__}: {cause}. Render it again with: {rerender_command(run.path, report)}")


def write_report_html(run: RunData, path: Path) -> ReportError | None:
    """Write report.html; any failure comes back as a ReportError (raised by the caller once the run is
    complete) instead of propagating from the middle of finishing the run."""
    try:
        html_report.write_html(run, path)  # by the module: a test can break the renderer
    except Exception as exc:  # a renderer bug or a full disk must not cost the finished run
        return ReportError(run, path, exc)
    return None


def show_finished_run(run: RunData, quiet: bool, error: ReportError | None = None) -> None:
    """The terminal summary (or the one summary line with --quiet), then any report error; exits 3 if a
    report could not be rendered, after printing everything that could be."""
    errors = Console(stderr=True)
    summary_failed: Exception | None = None
    try:
        if quiet:
            print(terminal.summary_line(run))  # one line whatever the terminal width: scripts grep it
            warning = empty_answer_warning(gather(run))
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        else:
            terminal.render_summary(run, output_console())
    except Exception as exc:  # same reason as write_report_html
        summary_failed = exc
    if error is not None:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True)
    if summary_failed is not None:
        html = error.report if error is not None else None
        errors.print(f"[bold red]error:[/] the run finished and its directory {escape(str(run.path))} is complete, "
                     f"but its summary could not be printed ({escape(type(summary_failed).__name__)}: "
                     f"{escape(str(summary_failed))}; a flakecheck bug, please report it). Print it again with: "
                     f"{escape(rerender_command(run.path, html))}", soft_wrap=True)
    if error is not None or summary_failed is not None:
        sys.exit(EXIT_REPORT_FAILED)
