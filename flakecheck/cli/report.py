"""`flakecheck report RUN_DIR`: render a run directory alone (no model, no suite file needed)."""

from __future__ import annotations

import sys
from pathlib import Path

from flakecheck.console import output_console
from flakecheck.data.rundir import load_run
from flakecheck.errors import UserError
from flakecheck.reports.html import write_html
from flakecheck.reports.json_report import render_json
from flakecheck.reports.markdown import render_markdown
from flakecheck.reports.terminal import render_summary

FORMATS = ("terminal", "markdown", "json")


def report_command(run_dir: Path, format: str, html: Path | None, top: int) -> int:
    if format not in FORMATS:
        raise UserError(f"unknown --format {format!r}; choose {', '.join(FORMATS)}")
    if top < 0:
        raise UserError(f"--top must be >= 0, got {top}")
    run = load_run(run_dir)
    if format == "terminal":
        console = output_console()
        render_summary(run, console, top=top)
    elif format == "markdown":
        sys.stdout.write(render_markdown(run, top))
    else:
        sys.stdout.write(render_json(run, top))
    if html is not None:
        try:
            write_html(run, html)
        except OSError as exc:
            raise UserError(f"{html}: cannot write the HTML report ({exc.strerror or exc})") from exc
        # stderr, so `--format json --html X > report.json` still gives pure JSON on stdout
        print(f"HTML report written to {html}", file=sys.stderr)
    return 0
