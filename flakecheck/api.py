"""The Python API: run a suite, load a run directory, explain a run's flips.

    import flakecheck
    run = flakecheck.run_suite("suites/demo.jsonl", kernels="splitk", limit=20)
    run.cases[run.cases.status != "stable"]
    flakecheck.load_run(run.path).runs
    flakecheck.explain_run(run.path).attribution
    flakecheck.diff_runs("reports/before", "reports/after").counts  # regression, noise, ... per case
"""

from __future__ import annotations

from flakecheck.data.rundir import RunData, load_run
from flakecheck.diff.compare import diff_runs
from flakecheck.explain.explainer import explain_run
from flakecheck.run.engine_source import run_suite
from flakecheck.run.pipeline import RunInterrupted

__all__ = ["RunData", "RunInterrupted", "diff_runs", "explain_run", "load_run", "run_suite"]
