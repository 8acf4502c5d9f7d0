"""`flakecheck probe` on the command line: the API call, a progress bar, then the terminal summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from flakecheck.console import output_console
from flakecheck.data.rundir import RunData
from flakecheck.probe.levels import parse_concurrency
from flakecheck.probe.probe import probe_suite
from flakecheck.probe.settings import ProbeConfig, parse_repeat
from flakecheck.reports.finished import ReportError, show_finished_run
from flakecheck.run.options import parse_ids
from flakecheck.run.pipeline import RunInterrupted


def probe_from_cli(suite: Path, *, endpoint: str, model: str | None, api: str | None, api_key_env: str | None,
                   dtype: str | None, concurrency: str, fillers: int, prefix: bool, repeat: str, max_tokens: int,
                   limit: int | None, ids: str | None, out: Path | None, resume: bool, isolation: str,
                   timeout: float, retries: int, gap_threshold: float, gap_window: int, html: bool,
                   quiet: bool, noise: Path | None = None, noise_in_flight: int | None = None) -> None:
    rounds, auto = parse_repeat(repeat)
    config = ProbeConfig(suite, endpoint, model=model, api=api, api_key_env=api_key_env, dtype=dtype,
                         concurrency=tuple(parse_concurrency(concurrency)), fillers=fillers, prefix=prefix,
                         repeat=rounds, auto=auto, max_tokens=max_tokens, limit=limit, ids=parse_ids(ids), out=out,
                         isolation=isolation, timeout=timeout, retries=retries, gap_threshold=gap_threshold,
                         gap_window=gap_window, html=html, noise=noise, noise_in_flight=noise_in_flight)
    try:
        run = probe_suite(config, resume=resume, progress=not quiet)
    except RunInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{escape(str(exc))}[/yellow]")
        sys.exit(130)
    except ReportError as exc:
        _server_lines(exc.run, quiet)
        show_finished_run(exc.run, quiet, exc)
        return
    _server_lines(run, quiet)
    show_finished_run(run, quiet)


def _server_lines(run: RunData, quiet: bool) -> None:
    """What the probe saw of the server: its version, the requests and retries, filler failures."""
    if quiet:
        return
    server = run.meta["server"]
    line = (f"probed {server['endpoint']} · model {server['model']} · server version {server['version'] or 'unknown'}"
            f" · {server['requests']} requests, {server['retried']} retried · token ids: {server['token_ids']}")
    output_console().print(escape(line), soft_wrap=True)
    for warning in filler_warnings(server["levels"]):
        Console(stderr=True).print(f"[yellow]{escape(warning)}[/yellow]", soft_wrap=True)


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
