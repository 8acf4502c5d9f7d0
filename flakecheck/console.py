"""The console every command prints its summary on."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 120  # a CI log or a file is read in a wide window; rich's 80 columns would squeeze every table


def output_console() -> Console:
    """Standard output at the terminal's width. A pipe or a file gets tables 120 columns wide (COLUMNS, if set,
    wins) and lines of text unbroken, so a log can be searched for them."""
    console = Console()
    if console.is_terminal:
        return console
    return Console(width=None if "COLUMNS" in os.environ else PIPED_WIDTH, soft_wrap=True)
