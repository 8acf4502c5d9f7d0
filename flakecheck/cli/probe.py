"""`flakecheck probe` on the command line: the API call, a progress bar, then the terminal summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flakecheck.probe.levels import parse_concurrency
from flakecheck.probe.probe import ProbeInterrupted, probe_suite
from flakecheck.probe.settings import ProbeConfig
from flakecheck.run.settings import parse_ids


def probe_from_cli(*, suite: Path, concurrency: str, ids: str | None, quiet: bool, resume: bool,
                   **options: Any) -> None:
    from rich.console import Console
    from rich.markup import escape

    from flakecheck.console import output_console
    from flakecheck.reports.terminal import render_summary, summary_line

    config = ProbeConfig(suite, concurrency=tuple(parse_concurrency(concurrency)), ids=parse_ids(ids), **options)
    try:
        run = probe_suite(config, resume=resume, progress=not quiet)
    except ProbeInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{escape(str(exc))}[/yellow]")
        sys.exit(130)
    server = run.meta["server"]
    line = (f"probed {server['endpoint']} · model {server['model']} · server version {server['version'] or 'unknown'}"
            f" · {server['requests']} requests, {server['retried']} retried · token ids: {server['token_ids']}")
    if quiet:
        print(summary_line(run))  # one line whatever the terminal width: scripts grep it
        return
    console = output_console()
    console.print(escape(line), soft_wrap=True)
    for warning in filler_warnings(server["levels"]):
        Console(stderr=True).print(f"[yellow]{escape(warning)}[/yellow]", soft_wrap=True)
    render_summary(run, console)


def filler_warnings(levels: dict[str, dict[str, Any]]) -> list[str]:
    """A line for each load level whose filler requests failed: the load was lighter than asked."""
    lines = []
    for label, level in levels.items():
        failed, sent = level.get("fillers_failed") or 0, level.get("fillers_sent") or 0
        if failed:
            first = (level.get("filler_errors") or ["no message"])[0]
            lines.append(f"level {label}: {failed} of {sent} filler requests failed, so it ran under less load than "
                         f"asked (first: {first})")
    return lines
