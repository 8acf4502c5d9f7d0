"""What a comparison found, which every renderer reads: both sides, the pairing, each case's class, the score
change and the gate's decision."""

from __future__ import annotations

from dataclasses import dataclass

from flakecheck.diff.classify import CLASSES, CaseDiff
from flakecheck.diff.pairing import Pairing
from flakecheck.diff.score import ScoreChange
from flakecheck.diff.side import Side


@dataclass(frozen=True)
class DiffGate:
    """Exit 1 when more cases than `max_regressions` regress, or when every pairing of compositions shows the
    score drop by more than `max_score_drop` percentage points (None: the score is not gated)."""

    max_regressions: int = 0
    max_score_drop: float | None = 0.0


@dataclass(frozen=True)
class DiffResult:
    a: Side
    b: Side
    pairing: Pairing
    cases: tuple[CaseDiff, ...]  # in A's order
    score: ScoreChange
    gate: DiffGate
    failures: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def counts(self) -> dict[str, int]:
        counts = {kind: 0 for kind in CLASSES}
        for case in self.cases:
            counts[case.kind] += 1
        return counts

    def noise_line(self) -> str | None:
        """'8 noise: 2 verdict-flaky on A only, 4 on B only (the change made them flaky), 2 on both'."""
        noise = self.of_kind("noise")
        if not noise:
            return None
        n = {side: sum(c.flaky_on == side for c in noise) for side in ("A", "B", "both")}
        return (f"{len(noise)} noise: {n['A']} verdict-flaky on A only (B steady), {n['B']} on B only (the change "
                f"made them flaky), {n['both']} on both")

    def of_kind(self, kind: str) -> list[CaseDiff]:
        return [c for c in self.cases if c.kind == kind]

    @property
    def raw_changed(self) -> list[CaseDiff]:
        """The cases whose verdict differs between the two reference runs: what a one-run diff lists."""
        return [c for c in self.cases if c.raw_changed]

    @property
    def raw_counts(self) -> dict[str, int]:
        """The one-run diff's changed verdicts by class (only regression, improvement and noise can occur)."""
        counts = {kind: 0 for kind in CLASSES}
        for case in self.raw_changed:
            counts[case.kind] += 1
        return {kind: n for kind, n in counts.items() if n}

    def raw_sentence(self) -> str:
        """'a one-run diff (reference vs reference) shows 9 changed verdicts: 5 regression, 4 noise'."""
        changed = self.raw_changed
        if not changed:
            return "a one-run diff (reference against reference) shows no changed verdict"
        parts = ", ".join(f"{n} {kind}" for kind, n in self.raw_counts.items())
        return (f"a one-run diff (reference against reference) shows {len(changed)} changed verdict(s): {parts}")
