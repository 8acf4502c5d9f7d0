"""`flakecheck explain` and `flakecheck repro`: thin layers over explain_run and write_repro."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.markup import escape

from flakecheck.console import output_console
from flakecheck.explain.explainer import explain_run
from flakecheck.explain.repro import README, SCRIPT, write_repro
from flakecheck.grading.external import DEFAULT_TIMEOUT_S
from flakecheck.reports.explanation import explanation
from flakecheck.reports.formats import JSON, MARKDOWN, TERMINAL, choose_outputs, write_files
from flakecheck.reports.json_report import explain_dict
from flakecheck.reports.markdown import explanation_lines
from flakecheck.reports.terminal import render_explanation
from flakecheck.run.options import parse_ids


def explain_from_cli(run_dir: Path, ids: str | None, json_out: bool, steps_after: int, grader: str | None,
                     grader_timeout: float = DEFAULT_TIMEOUT_S, suite: Path | None = None, fixes: bool = True,
                     top: int = 20, quiet: bool = False, ray: str | None = None, workers: int = 2,
                     cpus_per_worker: int | None = None, allow_mixed_devices: bool = False,
                     device: str | None = None, formats: Sequence[str] = ()) -> int:
    """`formats`: --format's entries; `json_out`: the old --json."""
    outputs = choose_outputs(formats, "explain", json=json_out)
    try:
        run = explain_run(run_dir, ids=parse_ids(ids), steps_after=steps_after, grader=grader,
                          grader_timeout=grader_timeout, suite=suite, fixes=fixes,
                          progress=not quiet and outputs.stdout == TERMINAL.name, ray=ray, workers=workers,
                          cpus_per_worker=cpus_per_worker, allow_mixed_devices=allow_mixed_devices, device=device)
    except KeyboardInterrupt:
        # explain writes its tables only at the end: an interruption leaves the run directory as it was
        print(f"interrupted: {run_dir} is unchanged (explain writes nothing until it has finished)", file=sys.stderr)
        raise
    found = explanation(run)
    assert found is not None
    renderers = {JSON.name: lambda: json.dumps({"run_dir": str(run.path), **(explain_dict(found) or {})}, indent=2,
                                               ensure_ascii=False, allow_nan=False) + "\n",
                 MARKDOWN.name: lambda: "\n".join(explanation_lines(found, top)).lstrip("\n") + "\n"}
    write_files(outputs, renderers)
    if outputs.stdout != TERMINAL.name:
        sys.stdout.write(renderers[outputs.stdout]())
        return 0
    console = output_console()
    if not found.cases:
        console.print(f"no diverged case to explain in {escape(str(run.path))}: every case gave the same tokens "
                      "under every composition")
        return 0
    render_explanation(found, console, top)
    console.print(f"written: {escape(str(run.path / 'attribution.parquet'))}"
                  + (f", {escape(str(run.path / 'fixes.parquet'))}" if found.fixes else ""))
    return 0


def repro_from_cli(run_dir: Path, case_id: str, out: Path | None, suite: Path | None = None) -> int:
    path = write_repro(run_dir, case_id, out, suite)
    print(f"repro of {case_id} written to {path}: run `python3 {path / SCRIPT}` (see {path / README})")
    return 0
