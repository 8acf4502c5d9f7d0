"""The diff's gate: exit 1 on regressions beyond noise, or on a score drop beyond the batch-noise interval."""

from __future__ import annotations

from flakecheck.diff.classify import CaseDiff
from flakecheck.diff.result import DiffGate
from flakecheck.diff.score import ScoreChange, change_sentence
from flakecheck.errors import UserError

SHOWN_IDS = 10


def check_gate(max_regressions: int, max_score_drop: float | None) -> DiffGate:
    """The gate's options, checked at the edge."""
    if max_regressions < 0:
        raise UserError(f"--max-regressions must be >= 0, got {max_regressions}")
    if max_score_drop is not None and not 0.0 <= max_score_drop <= 100.0:
        raise UserError(f"--max-score-drop is in percentage points, between 0 and 100; got {max_score_drop}")
    return DiffGate(max_regressions, max_score_drop)


def gate_failures(gate: DiffGate, cases: list[CaseDiff], score: ScoreChange) -> tuple[str, ...]:
    failures = []
    regressions = [c.label for c in cases if c.kind == "regression"]
    if len(regressions) > gate.max_regressions:
        shown = ", ".join(regressions[:SHOWN_IDS]) + (" …" if len(regressions) > SHOWN_IDS else "")
        failures.append(f"{len(regressions)} regression(s) beyond batch noise (max {gate.max_regressions}): {shown}")
    high = score.high_pp
    if gate.max_score_drop is not None and high is not None and high < -gate.max_score_drop - 1e-9:
        failures.append(f"the score drops by more than {gate.max_score_drop:g} pp under every pairing of "
                        f"compositions: {change_sentence(score)}")
    return tuple(failures)
