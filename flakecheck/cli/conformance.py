"""`flakecheck conformance` on the command line: the check, then one line per axis (or the JSON), and the exit
code of the expectation (0 held, 1 an expected axis does not hold; 130 on Ctrl-C, the finished units kept)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flakecheck.console import output_console
from flakecheck.probe.conformance import ConformanceConfig, ConformanceInterrupted, conformance_check
from flakecheck.probe.conformance.markdown import conformance_lines, conformance_markdown
from flakecheck.reports.formats import JSON, MARKDOWN, TERMINAL, choose_outputs, write_files


def conformance_from_cli(config: ConformanceConfig, *, resume: bool, json_out: bool, markdown: Path | None,
                         quiet: bool, formats: Sequence[str] = ()) -> int:
    """`formats`: --format's entries; `json_out` and `markdown`: the old --json and --markdown PATH."""
    outputs = choose_outputs(formats, "conformance", json=json_out, files={MARKDOWN.name: markdown})
    progress = Console(stderr=True, quiet=quiet or outputs.stdout != TERMINAL.name)
    try:
        result = conformance_check(config, resume=resume,
                                   on_unit=lambda name: progress.print(f"[dim]sending {escape(name)}[/dim]"))
    except ConformanceInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{escape(str(exc))}[/yellow]")
        sys.exit(130)
    renderers = {MARKDOWN.name: lambda: conformance_markdown(result.data),
                 JSON.name: lambda: json.dumps(result.data, indent=2) + "\n"}
    write_files(outputs, renderers)
    if outputs.stdout != TERMINAL.name:
        sys.stdout.write(renderers[outputs.stdout]())
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
