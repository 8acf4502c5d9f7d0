"""Where flakecheck keeps what it computes once per machine: dequantized GGUF weights, self-check verdicts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$FLAKECHECK_CACHE, else ~/.cache/flakecheck."""
    return Path(os.environ.get("FLAKECHECK_CACHE") or Path.home() / ".cache" / "flakecheck")
