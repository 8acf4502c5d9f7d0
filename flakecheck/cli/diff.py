"""`flakecheck diff A B` on the command line: two run directories compared as they are, or two suites run
first under the same settings; then the report (terminal or JSON), the files asked for, and the gate's exit."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from flakecheck.console import output_console
from flakecheck.data.compositions import resolve_compositions
from flakecheck.data.rundir import load_run
from flakecheck.diff.both import run_both
from flakecheck.diff.compare import diff_runs
from flakecheck.diff.gate import check_gate
from flakecheck.diff.html import render_diff_html
from flakecheck.diff.json_report import render_diff_json
from flakecheck.diff.junit import diff_junit_text
from flakecheck.diff.markdown import diff_markdown
from flakecheck.diff.terminal import render_diff
from flakecheck.errors import UserError
from flakecheck.gate.gate import _append_step_summary as append_step_summary
from flakecheck.reports.formats import HTML, JSON, JUNIT, MARKDOWN, TERMINAL, choose_outputs, write_files
from flakecheck.run.options import OPTIONS
from flakecheck.run.pipeline import RunInterrupted


def run_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The run options given on the command line (None, or a switch left off: not given), as run_suite's
    keywords (flakecheck/run/options.py)."""
    cli = {name: value for name, value in given.items() if value is not None and value is not False}
    options = {name: OPTIONS[name].api_value(value) for name, value in cli.items() if OPTIONS[name].in_config}
    if cli.get("compositions_file") is not None or cli.get("composition"):
        options["compositions"] = resolve_compositions(cli.get("compositions_file"), cli.get("composition") or [])
    return options


def diff_from_cli(a: Path, b: Path, options: dict[str, Any], *, model_b: str | None, out: Path | None,
                  quiet: bool, json_out: bool, markdown: Path | None, html: Path | None, junit: Path | None,
                  max_regressions: int, max_score_drop: float | None, top: int, formats: Sequence[str] = ()) -> int:
    """`formats`: --format's entries; `json_out`, `markdown`, `html`, `junit`: the old --json and file flags."""
    outputs = choose_outputs(formats, "diff", json=json_out,
                             files={MARKDOWN.name: markdown, HTML.name: html, JUNIT.name: junit})
    gate = check_gate(max_regressions, max_score_drop)
    if top < 0:
        raise UserError(f"--top must be >= 0, got {top}")
    if a.is_dir() and b.is_dir():
        given = sorted(options) + (["model-b"] if model_b else []) + (["out"] if out is not None else [])
        if given:
            raise UserError(f"{a} and {b} are run directories: the run options ({', '.join(given)}) apply only "
                            "when diff runs two suites itself")
        run_a, run_b, folder = load_run(a), load_run(b), None
    elif a.is_file() and b.is_file():
        try:
            run_a, run_b = run_both(a, b, options, out, model_b, progress=not quiet)
        except RunInterrupted as exc:
            Console(stderr=True).print(f"[yellow]{exc}[/yellow]")
            return 130
        folder = run_a.path.parent
    else:
        kinds = ", ".join(f"{p}: {'a directory' if p.is_dir() else 'a file' if p.is_file() else 'not found'}"
                          for p in (a, b))
        raise UserError(f"give two run directories or two suite files ({kinds})")
    result = diff_runs(run_a, run_b, gate)
    text = diff_markdown(result)
    renderers = {JSON.name: lambda: render_diff_json(result), MARKDOWN.name: lambda: text,
                 HTML.name: lambda: render_diff_html(result), JUNIT.name: lambda: diff_junit_text(result)}
    if folder is not None:  # the one-command path keeps its comparison beside the two runs
        outputs = replace(outputs, files=(*outputs.files, (JSON.name, folder / "diff.json"),
                                          (HTML.name, folder / "diff.html")))
    write_files(outputs, renderers)
    append_step_summary(text)
    if outputs.stdout != TERMINAL.name:
        sys.stdout.write(renderers[outputs.stdout]())
    else:
        console = output_console()
        render_diff(result, console, top)
        if folder is not None:
            console.print(f"runs: {run_a.path} (A), {run_b.path} (B); diff: {folder / 'diff.html'}, "
                          f"{folder / 'diff.json'}")
    return 0 if result.passed else 1
