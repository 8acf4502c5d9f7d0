"""`flakecheck compare RUN_A RUN_B`: the same suite diagnosed twice, held against each other.

Typically A is a simulated `run` and B a `probe` of the server the suite is evaluated against:

- per case, whether it diverged (status flaky or verdict_flaky) in A, in B, in both or in neither;
- the AUROC of A's predicted flip probability (`p_flip_pred`; the old `risk` for a run directory from
  before predictions) for B's divergence: the chance that a case B saw diverge is predicted higher in A
  than a case B saw stable, ties counting one half (the Mann-Whitney statistic over all pairs). It is
  undefined, and reported so, when B's cases are all diverged or all not;
- among the cases diverged in both, how often the first divergence is at the same step, and the
  median absolute difference of the steps;
- how many reference (serial) answers the two runs share token for token (text for text where a run's
  token ids are not the model's), and the calibration of A's predicted flip probability (`p_flip_pred`)
  against B's observed one (`p_flip`, over B's draws: a probe with `--repeat`, or a run with `--sample`):
  AUROC, Spearman, Brier and reliability bins, over every common case and separately over the cases whose
  references agree and those whose references already differ (where A diagnoses another trajectory
  than B's, and a prediction can only be right by chance).

Cases are matched by id; cases present in only one run are listed, never silently dropped.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.markup import escape
from rich.table import Table

from flakecheck.analysis.flip.calibration import calibrate
from flakecheck.console import output_console
from flakecheck.data.record import RunRecord
from flakecheck.data.rundir import RunData, load_run
from flakecheck.errors import UserError
from flakecheck.reports.facts import DIVERGED, clean, records
from flakecheck.reports.flip_view import prediction_note
from flakecheck.reports.formats import JSON, TERMINAL, choose_outputs, write_files

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
    # reference answers shared token for token: {"compared": n, "same": n, "by": "tokens" | "text"} (None:
    # a run without its runs table)
    references: dict[str, Any] | None = None
    # A's p_flip_pred against B's p_flip: {"all": ..., "same_reference": ..., "different_reference": ...}, each
    # a calibration block (flakecheck.analysis.flip.calibration) or None; None when B has no draws or A no predictions
    probability: dict[str, Any] | None = None
    predictor: str = "predicted flip probability"  # what the AUROC ranks A's cases by

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
    predicted = "p_flip_pred" in a.cases and bool(a.cases["p_flip_pred"].notna().any())
    for case_id in common:
        ra, rb = rows_a[case_id], rows_b[case_id]
        da, db = ra["status"] in DIVERGED, rb["status"] in DIVERGED
        category = "both" if da and db else "a_only" if da else "b_only" if db else "neither"
        counts[category] += 1
        # a run directory from before predictions ranks by its old risk score: it still compares
        predictor = _number(ra.get("p_flip_pred")) if predicted else _number(ra.get("risk"))
        if predictor is not None:
            scores.append(predictor)
            labels.append(db)
        step_a, step_b = clean(ra.get("first_divergence")), clean(rb.get("first_divergence"))
        if da and db and step_a is not None and step_b is not None:
            steps.append((int(step_a), int(step_b)))
        cases.append({"case_id": case_id, "category": category, "status_a": ra["status"], "status_b": rb["status"],
                      "predicted_a": predictor,
                      "first_divergence_a": None if step_a is None else int(step_a),
                      "first_divergence_b": None if step_b is None else int(step_b)})
    same_reference, references = _same_references(a, b, common)
    for case in cases:
        case["same_reference"] = same_reference.get(case["case_id"])
        case["p_flip_pred_a"] = _number(rows_a[case["case_id"]].get("p_flip_pred"))
        case["p_flip_b"] = _number(rows_b[case["case_id"]].get("p_flip"))
    return Comparison(_describe(a), _describe(b), len(common), sorted(set(rows_a) - set(rows_b)),
                      sorted(set(rows_b) - set(rows_a)), counts, auroc(scores, labels), step_agreement(steps), cases,
                      references, _probability(cases, (b.record.flip or {}).get("n_draws")),
                      "predicted flip probability" if predicted else "risk (a run directory from before predictions)")


def _probability(cases: list[dict[str, Any]], n_draws: int | None) -> dict[str, Any] | None:
    def block(subset: list[dict[str, Any]]) -> dict[str, Any] | None:
        return calibrate([c["p_flip_pred_a"] for c in subset], [c["p_flip_b"] for c in subset], n_draws)

    everything = block(cases)
    if everything is None:
        return None
    return {"all": everything, "same_reference": block([c for c in cases if c["same_reference"] is True]),
            "different_reference": block([c for c in cases if c["same_reference"] is False])}


def _model_ids(record: RunRecord) -> bool:
    """Whether a run's token ids are the model's vocabulary (the engine's, or a server that reports them)."""
    server = record.server or {}
    return record.source == "engine" or (record.source == "probe" and server.get("token_ids") == "server")


def _same_references(a: RunData, b: RunData, common: list[str]) -> tuple[dict[str, bool], dict[str, Any] | None]:
    """Per common case, whether the two reference answers are equal; and the counts."""
    by = "tokens" if _model_ids(a.record) and _model_ids(b.record) else "text"

    def answers(run: RunData) -> dict[str, Any]:
        runs = run.runs
        if runs.empty or "composition" not in runs:
            return {}
        reference = run.record.reference
        rows = runs[(runs["composition"] == reference) & (runs["repeat"] == 0)]
        column = "token_ids" if by == "tokens" else "text"
        return {str(c): (tuple(int(t) for t in v) if by == "tokens" else clean(v))
                for c, v in zip(rows["case_id"], rows[column])}

    ref_a, ref_b = answers(a), answers(b)
    same = {case: ref_a[case] == ref_b[case] for case in common if case in ref_a and case in ref_b}
    if not same:
        return {}, None
    return same, {"compared": len(same), "same": sum(same.values()), "by": by}


def _number(value: Any) -> float | None:
    value = clean(value)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _describe(run: RunData) -> dict[str, Any]:
    record = run.record
    return {"path": str(run.path), "source": record.source, "model": record.model, "policy": record.computer.policy,
            "endpoint": (record.server or {}).get("endpoint"), "suite_sha256": record.suite_sha256,
            "n_cases": len(run.cases), "noise_source": (record.flip or {}).get("noise_source"),
            "prediction": prediction_note(record.flip)}




def compare_command(path_a: Path, path_b: Path, json_out: bool = False, formats: Sequence[str] = ()) -> int:
    """`formats`: --format's entries; `json_out`: the old --json."""
    outputs = choose_outputs(formats, "compare", json=json_out)
    result = compare_runs(load_run(path_a), load_run(path_b))
    renderers = {JSON.name: lambda: json.dumps(result.to_dict(), sort_keys=True) + "\n"}
    write_files(outputs, renderers)
    if outputs.stdout == TERMINAL.name:
        render(result)
    else:
        sys.stdout.write(renderers[outputs.stdout]())
    return 0


def render(result: Comparison) -> None:
    console = output_console()
    a, b = result.run_a, result.run_b
    for tag, run in (("A", a), ("B", b)):
        what = run["endpoint"] or f"{run['model']} ({run['policy']})"
        console.print(f"[bold]{tag}[/]: {escape(run['path'])} — {escape(str(run['source']))}, {escape(str(what))}, "
                      f"{run['n_cases']} cases", soft_wrap=True)
    if a["prediction"]:
        console.print(f"A's {escape(a['prediction'])}", soft_wrap=True)
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
        console.print(f"AUROC of A's {result.predictor} for B's divergence: {roc.undefined_reason}")
    else:
        console.print(f"AUROC of A's {result.predictor} for B's divergence: [bold]{roc.value:.3f}[/] "
                      f"({roc.n_positive} diverged vs {roc.n_negative} not in B)")
    steps = result.first_divergence
    if steps.n_both:
        console.print(f"first divergence, {steps.n_both} cases diverged in both: same step in {steps.exact}, "
                      f"median |step A - step B| = {steps.median_abs_diff:g}")
    else:
        console.print("first divergence: no case diverged in both runs")
    _render_probability(result, console)
    disagree = [c for c in result.cases if c["category"] in ("a_only", "b_only")]
    if disagree:
        console.print(_disagreement_table(disagree))
    for tag, ids in (("A", result.only_in_a), ("B", result.only_in_b)):
        if ids:
            shown = ", ".join(escape(i) for i in ids[:20]) + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
            console.print(f"[yellow]only in {tag} ({len(ids)}):[/] {shown}")


def _render_probability(result: Comparison, console: Any) -> None:
    refs = result.references
    if refs is not None:
        unit = "token for token" if refs["by"] == "tokens" else "text for text (token ids are not comparable)"
        console.print(f"reference answers shared {unit}: [bold]{refs['same']}[/] of {refs['compared']}")
    probability = result.probability
    if probability is None:
        console.print("flip probability: not compared (B has no draws: probe with --repeat N or run with --sample "
                      "N; or A has no predictions)")
        return
    for key, label in (("all", "all common cases"), ("same_reference", "references agree"),
                       ("different_reference", "references differ")):
        block = probability.get(key)
        if block is None:
            console.print(f"A's predicted vs B's observed flip probability, {label}: no case")
            continue
        console.print(f"A's predicted vs B's observed flip probability, {label} ({block['n_cases']} cases): "
                      f"AUROC {_fmt(block['auroc'])} · Spearman {_fmt(block['spearman'])} · Brier "
                      f"{_fmt(block['brier'])} · mean predicted {_fmt(block['mean_predicted'])} vs observed "
                      f"{_fmt(block['mean_observed'])}")
    bins = [b for b in probability["all"]["bins"] if b["n"]]
    console.print("  reliability (predicted bin: cases, mean predicted -> mean observed): " + "; ".join(
        f"{b['low']:.1f}–{b['high']:.1f}: {b['n']}, {b['mean_predicted']:.2f} -> {b['mean_observed']:.2f}"
        for b in bins))


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _disagreement_table(cases: list[dict[str, Any]], top: int = 10):
    """The cases one run saw diverge and the other did not, most likely to flip in A first."""
    ranked = sorted(cases, key=lambda c: (-(c["predicted_a"] or 0.0), c["case_id"]))[:top]
    table = Table(title=f"diverged in one run only ({len(cases)}, {len(ranked)} shown)", title_justify="left",
                  show_edge=False)
    for name, justify in (("case", "left"), ("status A", "left"), ("status B", "left"), ("predicted A", "right"),
                          ("step A", "right"), ("step B", "right")):
        table.add_column(name, justify=justify, overflow="fold")
    for c in ranked:
        table.add_row(escape(c["case_id"]), c["status_a"], c["status_b"],
                      "—" if c["predicted_a"] is None else f"{c['predicted_a']:.2f}",
                      "—" if c["first_divergence_a"] is None else str(c["first_divergence_a"]),
                      "—" if c["first_divergence_b"] is None else str(c["first_divergence_b"]))
    return table
