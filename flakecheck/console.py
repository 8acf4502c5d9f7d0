"""The console every command prints its summary on."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 120  # a CI log or a file is read in a wide window; rich's 80 columns would wrap every table


def output_console() -> Console:
    """Standard output at the terminal's width; 120 columns when it is a pipe or a file (COLUMNS, if set, wins)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=PIPED_WIDTH)
    return console
