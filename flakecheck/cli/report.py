"""`flakecheck report RUN_DIR`: render a run directory alone (no model, no suite file needed)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from flakecheck.console import output_console
from flakecheck.data.rundir import load_run
from flakecheck.errors import UserError
from flakecheck.reports.formats import HTML, JSON, MARKDOWN, TERMINAL, choose_outputs, write_files
from flakecheck.reports.html import render_html
from flakecheck.reports.json_report import render_json
from flakecheck.reports.markdown import render_markdown
from flakecheck.reports.terminal import render_summary


def report_command(run_dir: Path, format: str | Sequence[str], html: Path | None, top: int) -> int:
    """`format`: --format's entries (NAME on stdout, NAME=PATH to a file); `html`: the old --html PATH."""
    outputs = choose_outputs(format, "report", files={HTML.name: html})
    if top < 0:
        raise UserError(f"--top must be >= 0, got {top}")
    run = load_run(run_dir)
    renderers = {MARKDOWN.name: lambda: render_markdown(run, top), JSON.name: lambda: render_json(run, top),
                 HTML.name: lambda: render_html(run)}
    if outputs.stdout == TERMINAL.name:
        render_summary(run, output_console(), top=top)
    else:
        sys.stdout.write(renderers[outputs.stdout]())
    write_files(outputs, renderers)
    for name, path in outputs.files:
        # stderr, so `--format json --html X > report.json` still gives pure JSON on stdout
        print(f"{'HTML' if name == HTML.name else name} report written to {path}", file=sys.stderr)
    return 0
