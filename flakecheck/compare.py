"""`flakecheck compare RUN_A RUN_B`: the same suite diagnosed twice, held against each other.

Typically A is a simulated `run` and B a `probe` of the server the suite is evaluated against:

- per case, whether it diverged (status flaky or verdict_flaky) in A, in B, in both or in neither;
- the AUROC of A's `risk` for B's divergence: the chance that a case B saw diverge has a higher
  risk in A than a case B saw stable, ties counting one half (the Mann-Whitney statistic over all
  pairs). It is undefined, and reported so, when B's cases are all diverged or all not;
- among the cases diverged in both, how often the first divergence is at the same step, and the
  median absolute difference of the steps.

Cases are matched by id; cases present in only one run are listed, never silently dropped.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flakecheck.errors import UserError
from flakecheck.reports.facts import DIVERGED, EngineFacts, clean, records
from flakecheck.rundir import RunData, load_run

CATEGORIES = ("both", "a_only", "b_only", "neither")


@dataclass(frozen=True)
class Auroc:
    value: float | None
    n_positive: int  # cases diverged in B
    n_negative: int
    undefined_reason: str | None = None


@dataclass(frozen=True)
class StepAgreement:
    n_both: int  # cases diverged in both runs
    exact: int  # of those, first divergence at the same step
    median_abs_diff: float | None


@dataclass
class Comparison:
    run_a: dict[str, Any]
    run_b: dict[str, Any]
    n_common: int
    only_in_a: list[str]
    only_in_b: list[str]
    counts: dict[str, int]
    auroc: Auroc
    first_divergence: StepAgreement
    cases: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def auroc(scores: list[float], labels: list[bool]) -> Auroc:
    """P(score of a positive > score of a negative) + 0.5 P(equal), over every positive/negative pair."""
    pos = np.array([s for s, y in zip(scores, labels) if y], dtype=np.float64)
    neg = np.array([s for s, y in zip(scores, labels) if not y], dtype=np.float64)
    if not len(pos) or not len(neg):
        which = "none" if not len(pos) else "all"
        return Auroc(None, len(pos), len(neg), f"undefined: {which} of the cases diverged in B")
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return Auroc(float((greater + 0.5 * ties) / (len(pos) * len(neg))), len(pos), len(neg))


def step_agreement(pairs: list[tuple[int, int]]) -> StepAgreement:
    if not pairs:
        return StepAgreement(0, 0, None)
    diffs = [abs(a - b) for a, b in pairs]
    return StepAgreement(len(pairs), sum(d == 0 for d in diffs), float(np.median(diffs)))


def compare_runs(a: RunData, b: RunData) -> Comparison:
    rows_a = {str(r["case_id"]): r for r in records(a.cases)}
    rows_b = {str(r["case_id"]): r for r in records(b.cases)}
    common = [case_id for case_id in rows_a if case_id in rows_b]
    if not common:
        raise UserError(f"{a.path} and {b.path} have no case id in common: not diagnoses of one suite")
    cases, counts = [], dict.fromkeys(CATEGORIES, 0)
    scores, labels, steps = [], [], []
    for case_id in common:
        ra, rb = rows_a[case_id], rows_b[case_id]
        da, db = ra["status"] in DIVERGED, rb["status"] in DIVERGED
        category = "both" if da and db else "a_only" if da else "b_only" if db else "neither"
        counts[category] += 1
        risk_a = _number(ra.get("risk"))
        if risk_a is not None:
            scores.append(risk_a)
            labels.append(db)
        step_a, step_b = clean(ra.get("first_divergence")), clean(rb.get("first_divergence"))
        if da and db and step_a is not None and step_b is not None:
            steps.append((int(step_a), int(step_b)))
        cases.append({"case_id": case_id, "category": category, "status_a": ra["status"], "status_b": rb["status"],
                      "risk_a": risk_a, "risk_b": _number(rb.get("risk")),
                      "first_divergence_a": None if step_a is None else int(step_a),
                      "first_divergence_b": None if step_b is None else int(step_b)})
    return Comparison(_describe(a), _describe(b), len(common), sorted(set(rows_a) - set(rows_b)),
                      sorted(set(rows_b) - set(rows_a)), counts, auroc(scores, labels), step_agreement(steps), cases)


def _number(value: Any) -> float | None:
    value = clean(value)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _describe(run: RunData) -> dict[str, Any]:
    meta = run.meta
    server = meta.get("server") if isinstance(meta.get("server"), dict) else {}
    return {"path": str(run.path), "source": meta.get("source", "engine"), "model": meta.get("model"),
            "policy": EngineFacts.of(meta).policy, "endpoint": server.get("endpoint"),
            "suite_sha256": meta.get("suite_sha256"), "n_cases": len(run.cases)}


def compare_command(path_a: Path, path_b: Path, json_out: bool = False) -> int:
    result = compare_runs(load_run(path_a), load_run(path_b))
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), sort_keys=True) + "\n")
    else:
        render(result)
    return 0


def render(result: Comparison) -> None:
    from rich.markup import escape
    from rich.table import Table

    from flakecheck.console import output_console

    console = output_console()
    a, b = result.run_a, result.run_b
    for tag, run in (("A", a), ("B", b)):
        what = run["endpoint"] or f"{run['model']} ({run['policy']})"
        console.print(f"[bold]{tag}[/]: {escape(run['path'])} — {escape(str(run['source']))}, {escape(str(what))}, "
                      f"{run['n_cases']} cases", soft_wrap=True)
    if a["suite_sha256"] != b["suite_sha256"]:
        console.print("[yellow]the two runs read different suite files; cases are matched by id[/]")
    table = Table(title=f"{result.n_common} cases in both runs", title_justify="left", show_edge=False)
    for name in ("diverged in", "cases"):
        table.add_column(name, justify="right" if name == "cases" else "left")
    for label, key in (("both", "both"), ("A only", "a_only"), ("B only", "b_only"), ("neither", "neither")):
        table.add_row(label, str(result.counts[key]))
    console.print(table)
    roc = result.auroc
    if roc.value is None:
        console.print(f"AUROC of A's risk for B's divergence: {roc.undefined_reason}")
    else:
        console.print(f"AUROC of A's risk for B's divergence: [bold]{roc.value:.3f}[/] "
                      f"({roc.n_positive} diverged vs {roc.n_negative} not in B)")
    steps = result.first_divergence
    if steps.n_both:
        console.print(f"first divergence, {steps.n_both} cases diverged in both: same step in {steps.exact}, "
                      f"median |step A - step B| = {steps.median_abs_diff:g}")
    else:
        console.print("first divergence: no case diverged in both runs")
    disagree = [c for c in result.cases if c["category"] in ("a_only", "b_only")]
    if disagree:
        console.print(_disagreement_table(disagree))
    for tag, ids in (("A", result.only_in_a), ("B", result.only_in_b)):
        if ids:
            shown = ", ".join(escape(i) for i in ids[:20]) + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
            console.print(f"[yellow]only in {tag} ({len(ids)}):[/] {shown}")


def _disagreement_table(cases: list[dict[str, Any]], top: int = 10):
    """The cases one run saw diverge and the other did not, riskiest in A first."""
    from rich.markup import escape
    from rich.table import Table

    ranked = sorted(cases, key=lambda c: (-(c["risk_a"] or 0.0), c["case_id"]))[:top]
    table = Table(title=f"diverged in one run only ({len(cases)}, {len(ranked)} shown)", title_justify="left",
                  show_edge=False)
    for name, justify in (("case", "left"), ("status A", "left"), ("status B", "left"), ("risk A", "right"),
                          ("step A", "right"), ("step B", "right")):
        table.add_column(name, justify=justify, overflow="fold")
    for c in ranked:
        table.add_row(escape(c["case_id"]), c["status_a"], c["status_b"],
                      "—" if c["risk_a"] is None else f"{c['risk_a']:.2f}",
                      "—" if c["first_divergence_a"] is None else str(c["first_divergence_a"]),
                      "—" if c["first_divergence_b"] is None else str(c["first_divergence_b"]))
    return table
