"""Shared by the harness tests: the CLI in-process, and what a run directory should say about the logs it
was imported from, recomputed from the logs (as inspect_ai's own reader and lm-eval's samples show them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from flakecheck import cli


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["flakecheck", *[str(a) for a in args]]
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


def parting(a: list, b: list) -> int | None:
    """Where two logged token (or text) sequences part: the first index that differs, the shorter length when
    one is a prefix of the other, None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def reported(cases: pd.DataFrame, case_id: str, column: str) -> object:
    value = cases.set_index("case_id").loc[case_id, column]
    return None if pd.isna(value) else value


def diverged(cases: pd.DataFrame, case_id: str) -> bool:
    return reported(cases, case_id, "status") in ("flaky", "verdict_flaky")


def fixture(name: str) -> Path:
    return Path(__file__).parent / "fixtures" / "harness" / name
