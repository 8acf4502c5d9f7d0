"""The gate's quarantine file: known-flaky cases that are reported but do not fail the gate, until
their expiry date.

Format (JSON Lines, no YAML dependency): one object per line with the case `id`, a `reason`
and an `expires` date (YYYY-MM-DD; the entry holds through that day). Blank lines and lines
starting with `#` are ignored:

    # cases we know about; each entry says why and until when
    {"id": "math-17", "reason": "near-tie on ' 4' vs ' 5', see #123", "expires": "2026-03-31"}

An entry past its expiry date fails the gate, so a quarantine cannot silently become permanent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from flakecheck.data.jsonl import json_objects
from flakecheck.errors import InputError, UserError


@dataclass(frozen=True)
class QuarantineEntry:
    case_id: str
    reason: str
    expires: date
    line: int

    def expired(self, today: date) -> bool:
        return today > self.expires


def load_quarantine(path: Path) -> list[QuarantineEntry]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the quarantine file ({exc})") from exc
    entries: list[QuarantineEntry] = []
    seen: dict[str, int] = {}
    for number, obj in json_objects(str(path), text, comments=("#",)):
        entry = _parse_entry(str(path), number, obj)
        if entry.case_id in seen:
            raise InputError(str(path), number, "id",
                             f"{entry.case_id!r} is already quarantined on line {seen[entry.case_id]}")
        seen[entry.case_id] = number
        entries.append(entry)
    return entries


def _parse_entry(path: str, number: int, obj: dict[str, Any]) -> QuarantineEntry:
    case_id = obj.get("id")
    if isinstance(case_id, bool) or not isinstance(case_id, (str, int)) or str(case_id) == "":
        raise InputError(path, number, "id", "a case id (string or integer) is required")
    reason = obj.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise InputError(path, number, "reason", "say why the case is quarantined (a non-empty string)")
    expires = obj.get("expires")
    if not isinstance(expires, str):
        raise InputError(path, number, "expires", "an expiry date YYYY-MM-DD is required")
    try:
        expiry = date.fromisoformat(expires)
    except ValueError as exc:
        raise InputError(path, number, "expires", f"{expires!r} is not a date YYYY-MM-DD") from exc
    unknown = sorted(set(obj) - {"id", "reason", "expires"})
    if unknown:
        raise InputError(path, number, unknown[0], "unknown field (expected id, reason, expires)")
    return QuarantineEntry(str(case_id), reason.strip(), expiry, number)
