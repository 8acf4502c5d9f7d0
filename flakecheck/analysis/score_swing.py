"""Score swing: how far a suite's reported score can move from batch composition alone.

Definitions (over the *graded* cases: those with a pass/fail verdict, from checks, a target or --grader):

- the score under a composition: the share of graded cases that pass under it;
- the worst-case score: the share that pass under every composition; the best-case score: the share that
  pass under at least one;
- the swing: best-case − worst-case, in percentage points.

A production server puts each request in whatever batch it lands in, so one eval run is a mix of
compositions: any such run scores between the worst and the best case, and so does every single
composition. The swing is therefore the spread a reported score can show from batch composition alone,
and it equals the share of graded cases whose verdict flips. The per-composition minimum and maximum are
reported too (what replaying the whole suite under one composition at a time gave).

Each (composition, repeat) counts as its own composition. A case with no verdict under some composition
(no checks and no target) is left out of that composition's score; a case with no verdict anywhere is not
graded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Verdicts = Mapping[str, Mapping[str, "bool | None"]]  # case id -> composition -> passed (None: ungraded)


@dataclass(frozen=True)
class ScoreSwing:
    n_graded: int
    per_composition: dict[str, float | None]  # in composition order; None when nothing was graded there
    worst: float | None
    best: float | None
    cause: str = "batch composition"  # what the compositions change ("batch composition and TP size")

    @property
    def swing_pp(self) -> float | None:
        """best − worst in percentage points."""
        return None if self.worst is None or self.best is None else 100.0 * (self.best - self.worst)

    @property
    def low(self) -> tuple[str, float] | None:
        """The composition with the lowest score (the first one on a tie) and that score."""
        scored = [(name, rate) for name, rate in self.per_composition.items() if rate is not None]
        return min(scored, key=lambda item: item[1]) if scored else None

    @property
    def high(self) -> tuple[str, float] | None:
        scored = [(name, rate) for name, rate in self.per_composition.items() if rate is not None]
        return max(scored, key=lambda item: item[1]) if scored else None

    def to_dict(self) -> dict[str, object]:
        low, high = self.low, self.high
        return {"n_graded": self.n_graded, "per_composition": dict(self.per_composition),
                "min": None if low is None else {"composition": low[0], "score": low[1]},
                "max": None if high is None else {"composition": high[0], "score": high[1]},
                "worst_case": self.worst, "best_case": self.best, "swing_pp": self.swing_pp}


def score_swing(verdicts: Verdicts, compositions: Sequence[str], cause: str = "batch composition") -> ScoreSwing:
    """The score per composition (in the given order), the worst- and best-case scores and the swing."""
    graded = {case: [v for v in by_comp.values() if v is not None] for case, by_comp in verdicts.items()}
    graded = {case: vs for case, vs in graded.items() if vs}
    per_composition: dict[str, float | None] = {}
    for name in compositions:
        here = [verdicts[case].get(name) for case in graded]
        here = [v for v in here if v is not None]
        per_composition[name] = sum(here) / len(here) if here else None
    if not graded:
        return ScoreSwing(0, per_composition, None, None, cause)
    n = len(graded)
    return ScoreSwing(n, per_composition, sum(all(vs) for vs in graded.values()) / n,
                      sum(any(vs) for vs in graded.values()) / n, cause)


def swing_sentence(swing: ScoreSwing) -> str:
    """'your reported score can move from 55% to 67% (12.0 pp) from batch composition alone' (or why not)."""
    if swing.worst is None or swing.best is None:
        return "no graded cases: no score to swing"
    if swing.swing_pp == 0:
        return f"the score is {swing.worst:.0%} under every composition: no swing"
    return (f"your reported score can move from {swing.worst:.0%} to {swing.best:.0%} "
            f"({swing.swing_pp:.1f} pp) from {swing.cause} alone")
