"""A harness score as pass/fail.

inspect_ai: CORRECT "C" (and "yes"/true/1) passes; INCORRECT "I", NOANSWER "N" (and "no"/false/0) fail;
PARTIAL "P" fails (inspect's accuracy counts it 0.5: it is not a pass). lm-eval: a metric of 1 passes, 0
fails. Any other value (a fraction, a dict of values) is not a verdict: None, and the import says so."""

from __future__ import annotations

import math
from typing import Any

_PASS = {"C", "YES", "TRUE", "CORRECT"}
_FAIL = {"I", "N", "P", "NO", "FALSE", "INCORRECT"}


def verdict(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return True if value == 1 else False if value == 0 else None
    if isinstance(value, str):
        word = value.strip().upper()
        return True if word in _PASS else False if word in _FAIL else None
    return None
