"""Summaries printed to a pipe or a file are not wrapped at rich's 80 columns."""

from __future__ import annotations

import pytest

from flakecheck.console import PIPED_WIDTH, output_console


def test_a_pipe_gets_wide_lines_and_columns_wins(monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = output_console()
    assert not console.is_terminal and console.width == PIPED_WIDTH > 80
    console.print("x" * 100)
    assert "x" * 100 + "\n" in capfd.readouterr().out  # one line, not wrapped
    monkeypatch.setenv("COLUMNS", "90")
    assert output_console().width == 90
