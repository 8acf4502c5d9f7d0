"""Explaining a run's flips: which mechanism alone reproduces each one (`flakecheck explain`), the smallest
fix and what it costs, and a self-contained repro directory for one case (`flakecheck repro`).

`explain_run` is imported lazily: the reports read `flakecheck.explain.summary` without loading torch."""

from __future__ import annotations

from typing import Any

__all__ = ["explain_run"]


def __getattr__(name: str) -> Any:
    if name == "explain_run":
        from flakecheck.explain.explainer import explain_run

        return explain_run
    raise AttributeError(f"module 'flakecheck.explain' has no attribute {name!r}")
