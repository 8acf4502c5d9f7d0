"""Which case of A meets which case of B: by id when both sides hold the same ids, else by position (with a
warning) when they hold as many cases; anything else is bad input (exit 2), naming both sources."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from flakecheck.errors import UserError

SHOWN_IDS = 5  # ids named in a mismatch message


@dataclass(frozen=True)
class Pairing:
    pairs: tuple[tuple[str, str], ...]  # (A's case id, B's case id), in A's order
    by: str  # "id" | "position"
    warnings: tuple[str, ...] = field(default_factory=tuple)


def pair_cases(ids_a: Sequence[str], ids_b: Sequence[str], name_a: str, name_b: str) -> Pairing:
    """`ids_a`, `ids_b`: each side's case ids in suite order; `name_a`, `name_b`: the files or directories they
    came from, for the messages."""
    for ids, name in ((ids_a, name_a), (ids_b, name_b)):
        if not ids:
            raise UserError(f"{name}: no cases to compare")
        repeated = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) < len(ids) else []
        if repeated:
            raise UserError(f"{name}: case id {repeated[0]!r} appears more than once; ids must be unique to pair")
    if set(ids_a) == set(ids_b):
        return Pairing(tuple((i, i) for i in ids_a), "id")
    only_a = [i for i in ids_a if i not in set(ids_b)]
    only_b = [i for i in ids_b if i not in set(ids_a)]
    if len(ids_a) != len(ids_b):
        raise UserError(f"cannot pair the cases of {name_a} ({len(ids_a)}) and {name_b} ({len(ids_b)}): their ids "
                        f"differ (only in A: {_some(only_a)}; only in B: {_some(only_b)}) and their counts differ, "
                        "so they cannot be paired by position either")
    warning = (f"the case ids of {name_a} and {name_b} differ ({len(only_a)} only in A, e.g. {_some(only_a)}; "
               f"{len(only_b)} only in B, e.g. {_some(only_b)}): cases are paired by position")
    return Pairing(tuple(zip(ids_a, ids_b)), "position", (warning,))


def _some(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:SHOWN_IDS])
    return shown + (" …" if len(ids) > SHOWN_IDS else "") if ids else "none"
