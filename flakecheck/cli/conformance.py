"""`flakecheck conformance` on the command line: the check, then one line per axis (or the JSON), and the exit
code of the expectation (0 held, 1 an expected axis does not hold; 130 on Ctrl-C, the finished units kept)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flakecheck.console import output_console
from flakecheck.data.rundir import atomic_write_text
from flakecheck.probe.conformance import ConformanceConfig, ConformanceInterrupted, conformance_check
from flakecheck.probe.conformance.markdown import conformance_lines, conformance_markdown


def conformance_from_cli(config: ConformanceConfig, *, resume: bool, json_out: bool, markdown: Path | None,
                         quiet: bool) -> int:
    progress = Console(stderr=True, quiet=quiet or json_out)
    try:
        result = conformance_check(config, resume=resume,
                                   on_unit=lambda name: progress.print(f"[dim]sending {escape(name)}[/dim]"))
    except ConformanceInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{escape(str(exc))}[/yellow]")
        sys.exit(130)
    if markdown is not None:
        atomic_write_text(markdown, conformance_markdown(result.data))
    if json_out:
        print(json.dumps(result.data, indent=2))
        return result.exit_code
    console = output_console()
    server = result.data["server"]
    console.print(escape(f"conformance of {server['endpoint']} · model {server['model']} · server version "
                         f"{server['version'] or 'unknown'} · {result.data['requests']} requests in "
                         f"{result.data['seconds']:.0f} s"), soft_wrap=True)
    for line in conformance_lines(result.data):
        console.print(escape(line), soft_wrap=True)
    console.print(escape(f"conformance directory: {result.path} (noise profile for --noise: {result.path})"),
                  soft_wrap=True)
    return result.exit_code
