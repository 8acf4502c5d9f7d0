"""What the gate decided: its settings, each case's outcome and the verdict, which the terminal, JUnit and
markdown renderers read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakecheck.analysis.score_swing import ScoreSwing
from flakecheck.gate.quarantine import QuarantineEntry
from flakecheck.reports.facts import RunFacts


@dataclass
class GateSettings:
    max_flaky_rate: float
    max_verdict_flips: int
    fail_on_new_fragile: bool = False
    rate_from_baseline: bool = False
    flips_from_baseline: bool = False
    max_score_swing: float | None = None  # percentage points; None: not gated
    max_flip_probability: float | None = None  # on each case's interval's lower bound; None: not gated
    max_score_std: float | None = None  # percentage points, over the draws; None: not gated
    min_pass_rate: float | None = None  # per case, over its runs (1: pass^k); None: not gated


@dataclass
class CaseOutcome:
    """One case's result: `fail` (fails the gate), `flaky` (diverged, tolerated), `quarantined`, `pass`."""

    case: dict[str, Any]
    outcome: str
    reasons: list[str] = field(default_factory=list)
    baseline_status: str | None = None
    quarantine: QuarantineEntry | None = None
    passes: tuple[int, int] | None = None  # (runs passed, runs graded) over compositions x repeats

    @property
    def pass_k(self) -> bool | None:
        """pass^k: every one of its k graded runs passed (None: not graded)."""
        return None if self.passes is None else self.passes[0] == self.passes[1]

    @property
    def case_id(self) -> str:
        return str(self.case["case_id"])


@dataclass
class GateResult:
    facts: RunFacts
    settings: GateSettings
    failures: list[str]
    outcomes: list[CaseOutcome]
    flaky_rate: float
    n_judged: int
    n_flaky: int
    n_verdict_flips: int
    new_divergent: list[str]
    new_fragile: list[str]
    expired: list[QuarantineEntry]
    unknown_quarantined: list[str]
    baseline: Path | None
    score: ScoreSwing
    notes: list[str] = field(default_factory=list)
    score_std_pp: float | None = None  # over the draws, quarantined cases left out

    @property
    def passed(self) -> bool:
        return not self.failures

    def with_outcome(self, outcome: str) -> list[CaseOutcome]:
        return [o for o in self.outcomes if o.outcome == outcome]
