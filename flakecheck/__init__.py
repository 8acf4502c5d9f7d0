"""flakecheck: which eval cases flip at temperature 0 under batch composition, and why.

    import flakecheck
    run = flakecheck.run_suite("suites/demo.jsonl", kernels="splitk", limit=20)
    print(run.cases.status.value_counts())
    again = flakecheck.load_run(run.path)   # runs, tokens, cases DataFrames + meta

`run_suite` and `load_run` are imported lazily so `flakecheck --help` stays fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_run", "run_suite"]


def __getattr__(name: str) -> Any:
    if name == "run_suite":
        from flakecheck.api import run_suite

        return run_suite
    if name == "load_run":
        from flakecheck.rundir import load_run

        return load_run
    raise AttributeError(f"module 'flakecheck' has no attribute {name!r}")
