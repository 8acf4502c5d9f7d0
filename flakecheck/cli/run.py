"""`flakecheck run` on the command line: the settings from the options, the run with a progress bar, then the
terminal summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from flakecheck.data.compositions import resolve_compositions
from flakecheck.errors import UserError
from flakecheck.reports.finished import ReportError, show_finished_run
from flakecheck.run.engine_source import execute
from flakecheck.run.options import CONFIG_OPTIONS, OPTIONS
from flakecheck.run.pipeline import RunInterrupted
from flakecheck.run.settings import RunConfig, parse_sample


def run_from_cli(suite: Path, **given: Any) -> None:
    """`given`: the command line's value of each option `run` declares (flakecheck/run/options.py)."""
    cli = {name: OPTIONS[name].api_value(value) for name, value in given.items()}
    compositions = resolve_compositions(cli["compositions_file"], cli["composition"] or [])
    if cli["sample_only"]:
        if not parse_sample(cli["sample"])[0]:
            raise UserError("--sample-only needs --sample N (the compositions to draw)")
        compositions = compositions[:1]  # the reference alone beside the draws
    settings = {o.name: cli[o.name] for o in CONFIG_OPTIONS if o.name in cli}
    config = RunConfig.parse(suite, **settings, compositions=compositions)
    try:
        run = execute(config, resume=cli["resume"], progress=not cli["quiet"])
    except RunInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{exc}[/yellow]")
        sys.exit(130)
    except ReportError as exc:
        show_finished_run(exc.run, cli["quiet"], exc)
    else:
        show_finished_run(run, cli["quiet"])
