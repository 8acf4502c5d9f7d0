"""The lines every diff renderer shows, worded once: each side in one line, a case's pass rates and reference
verdicts, the mixed-run bounds, and the order cases are listed in."""

from __future__ import annotations

from flakecheck.diff.classify import CLASSES, CaseDiff
from flakecheck.diff.result import DiffResult
from flakecheck.diff.score import ScoreChange
from flakecheck.diff.side import Side

SHOWN_KINDS = ("regression", "improvement", "noise", "changed-text")  # "same" cases are counted, not listed


def side_line(side: Side) -> str:
    """'demo (61 cases) · model smollm2 · kernels splitk · 6 compositions — reports/a'."""
    record = side.record
    return (f"{record.suite_name} ({len(side.case_ids)} cases) · model {record.model} · kernels "
            f"{record.computer.policy} · {len(side.labels)} compositions"
            f"{f' ({len(side.draws)} draws)' if side.draws else ''} — {side.path}")


def rate(passed: int, graded: int) -> str:
    """'4/6' (passes of the graded compositions), '—' when ungraded."""
    return f"{passed}/{graded}" if graded else "—"


def verdict_word(value: bool | None) -> str:
    return "—" if value is None else ("pass" if value else "fail")


def reference_change(case: CaseDiff) -> str:
    """'pass → fail': the verdicts under each side's reference composition (the one-run diff)."""
    return f"{verdict_word(case.reference_a)} → {verdict_word(case.reference_b)}"


def counts_line(result: DiffResult) -> str:
    counts = result.counts
    return f"{len(result.cases)} cases: " + " · ".join(f"{counts[k]} {k}" for k in CLASSES)


def mixed_line(score: ScoreChange) -> str | None:
    """The bounds a pair of production runs (each a mix of compositions) can show, and the part beyond noise."""
    mixed, beyond = score.mixed_pp, score.beyond_noise_pp
    if mixed is None or beyond is None:
        return None
    return (f"two production runs, each a mix of compositions, can differ by {mixed[0]:+.1f} to {mixed[1]:+.1f} pp; "
            f"beyond noise (improvements minus regressions): {beyond:+.1f} pp")


def listed(result: DiffResult) -> list[CaseDiff]:
    """The cases a report lists: every class but `same`, regressions first."""
    order = {kind: i for i, kind in enumerate(SHOWN_KINDS)}
    return sorted((c for c in result.cases if c.kind in order), key=lambda c: order[c.kind])
