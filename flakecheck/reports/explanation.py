"""What `flakecheck explain` added to a run directory, as every report shows it (no model needed): per
diverged case, which mechanisms alone reproduce its flip; per mechanism, how many cases; the ranked fixes.

A run directory without explain.json has no explanation (None): its reports render as before.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from flakecheck.analysis.attribution import INTERACTION, LABELS, MECHANISMS, case_summary
from flakecheck.data.rundir import RunData
from flakecheck.reports.facts import clean, records


@dataclass
class CaseExplanation:
    case_id: str
    step: int | None
    where: str | None
    summary: str  # the mechanisms that alone reproduce it, joined by ' + ', or 'interaction'
    reduction: str | None  # ... among the kernels' reductions (None: no candidate)
    scheduling: str | None  # ... among the scheduling features
    rows: list[dict[str, Any]] = field(repr=False, default_factory=list)


@dataclass
class Explanation:
    cases: list[CaseExplanation]
    reproduces: dict[str, int]  # mechanism -> diverged cases it alone reproduces
    candidates: dict[str, int]  # mechanism -> diverged cases where it was variable (replayed)
    fixes: list[dict[str, Any]]  # ranked
    info: dict[str, Any]

    @property
    def interactions(self) -> list[str]:
        return [c.case_id for c in self.cases if c.summary == INTERACTION]

    @property
    def steps_after(self) -> int | None:
        return self.info.get("steps_after")

    def cost_line(self) -> str | None:
        """'attribution replays took 41 s, 0.31x the 130 s replay of the run'."""
        timings = self.info.get("timings") or {}
        seconds, run_s = timings.get("attribution_s"), timings.get("run_replay_s")
        if seconds is None:
            return None
        line = f"attribution replays took {seconds:.0f} s"
        if run_s:
            line += f", {seconds / run_s:.2f}x the {run_s:.0f} s replay of the run"
        fixes_s = timings.get("fixes_s")
        if fixes_s is not None:
            line += f"; the fix replays {fixes_s:.0f} s and their cost timings {timings.get('costs_s') or 0:.0f} s"
        return line


def explanation(run: RunData) -> Explanation | None:
    if run.explain is None or run.attribution is None:
        return None
    rows = records(run.attribution)
    for row in rows:  # an int column with nulls reads back as floats
        if row["first_divergence"] is not None:
            row["first_divergence"] = int(row["first_divergence"])
    by_case: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(str(row["case_id"]), []).append(row)
    facts = {str(c["case_id"]): c for c in records(run.cases)}
    cases = []
    for case_id, mine in by_case.items():
        summary = case_summary(mine)
        case = facts.get(case_id, {})
        step = clean(case.get("first_divergence"))
        cases.append(CaseExplanation(case_id, None if step is None else int(step), case.get("divergence_composition"),
                                     summary["summary"], summary["reduction"], summary["scheduling"], mine))
    reproduces = {m: sum(1 for r in rows if r["mechanism"] == m and r["reproduces"]) for m in MECHANISMS}
    candidates = {m: sum(1 for r in rows if r["mechanism"] == m and r["candidate"]) for m in MECHANISMS}
    fixes = sorted(records(run.fixes), key=lambda f: f["rank"]) if run.fixes is not None else []
    for fix in fixes:
        for key in ("changes", "replayed", "still_flaky"):
            fix[key] = list(fix.get(key) or [])
    return Explanation(cases, reproduces, candidates, fixes, run.explain)


def mechanism_counts(facts: Explanation) -> str:
    """'matmul split-K 40/61 · attention split-KV 3/61 · ... · interaction 6': cases each alone reproduces, of
    the cases where it was variable."""
    parts = [f"{LABELS[m]} {facts.reproduces[m]}/{facts.candidates[m]}" for m in MECHANISMS if facts.candidates[m]]
    parts.append(f"{INTERACTION} {len(facts.interactions)}")
    return " · ".join(parts)


def fmt_cost(fix: dict[str, Any]) -> str:
    factor = fix.get("cost_factor")
    return "—" if factor is None or (isinstance(factor, float) and math.isnan(factor)) else f"{factor:.2f}x"


def stabilised(fix: dict[str, Any]) -> str:
    return f"{fix['stabilised']}/{fix['flaky_cases']}" + (" (all)" if fix["full_fix"] else "")


def explain_command(run: RunData) -> str:
    return shlex.join(["flakecheck", "explain", str(run.path)])
