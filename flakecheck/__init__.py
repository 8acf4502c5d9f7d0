"""flakecheck: which eval cases flip at temperature 0 under batch composition, and why.

    import flakecheck
    run = flakecheck.run_suite("suites/demo.jsonl", kernels="splitk", limit=20)
    print(run.cases.status.value_counts())
    again = flakecheck.load_run(run.path)   # runs, tokens, cases DataFrames + meta
    why = flakecheck.explain_run(run.path)  # + attribution and fixes DataFrames

`run_suite`, `load_run` and `explain_run` are imported lazily so `flakecheck --help` stays fast.
"""

from __future__ import annotations

from typing import Any

from flakecheck.machine.fingerprint import flakecheck_version
from flakecheck.machine.pinning import pin as _pin

_pin()  # before torch loads anywhere through flakecheck: the libraries read these settings once

__version__ = flakecheck_version()
__all__ = ["__version__", "diff_runs", "explain_run", "load_run", "run_suite"]


def __getattr__(name: str) -> Any:
    if name in ("run_suite", "load_run", "explain_run", "diff_runs"):
        from flakecheck import api

        return getattr(api, name)
    raise AttributeError(f"module 'flakecheck' has no attribute {name!r}")
