"""`flakecheck diff SUITE_A SUITE_B`: run both suites under the same settings (the same compositions, the same
draws: the seed is shared), into DIR/a and DIR/b, then compare. Everything is checked before the first replay:
both sets of options, both suites, that their cases pair, and that neither side's directory holds anything."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flakecheck.data.rundir import RunData, default_run_dir
from flakecheck.data.suite import load_suite
from flakecheck.diff.pairing import pair_cases
from flakecheck.errors import UserError
from flakecheck.reports.finished import ReportError
from flakecheck.run.engine_source import execute
from flakecheck.run.settings import RunConfig

SIDES = ("a", "b")


def run_both(suite_a: Path, suite_b: Path, options: Mapping[str, Any], out: Path | None = None,
             model_b: str | None = None, progress: bool = False) -> tuple[RunData, RunData]:
    """`options`: run_suite's keyword options, shared by both sides; `model_b`: B's model, when it differs."""
    out = out if out is not None else default_run_dir(Path("diff"))
    configs = [RunConfig.parse(suite, out=out / side, **{**options, **({"model": model_b} if side == "b" and
                                                                      model_b else {})})
               for suite, side in zip((suite_a, suite_b), SIDES)]
    suites = [load_suite(c.suite) for c in configs]
    selected = [s.select(list(c.ids) or None, c.limit) for s, c in zip(suites, configs)]
    pair_cases([c.id for c in selected[0].cases], [c.id for c in selected[1].cases], str(suite_a), str(suite_b))
    for config in configs:
        assert config.out is not None
        if config.out.exists() and (not config.out.is_dir() or any(config.out.iterdir())):
            raise UserError(f"{config.out}: already exists and is not empty (choose another --out)")
    model = configs[0].engine.load()  # one load for both sides when they run the same model
    runs = []
    for config, suite in zip(configs, suites):
        same = config.engine == configs[0].engine
        try:
            runs.append(execute(config, model=model if same else None, suite=suite, progress=progress))
        except ReportError as exc:  # the run is complete, only its report.html failed: the diff still holds
            print(f"warning: {exc}", file=sys.stderr)
            runs.append(exc.run)
    return runs[0], runs[1]
