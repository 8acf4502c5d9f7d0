"""Summaries printed to a pipe or a file: tables wider than rich's 80 columns, lines of text unbroken."""

from __future__ import annotations

import pytest

from flakecheck.console import PIPED_WIDTH, output_console


def test_a_pipe_gets_wide_lines_and_columns_wins(monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = output_console()
    assert not console.is_terminal and console.width == PIPED_WIDTH > 80
    console.print("word " * 60)
    out = capfd.readouterr().out
    assert out.count("\n") == 1 and out.split() == ["word"] * 60  # 300 characters, one line
    monkeypatch.setenv("COLUMNS", "90")
    assert output_console().width == 90
