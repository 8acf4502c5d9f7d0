"""`flakecheck gate RUN_DIR`: a CI regression gate. Exit 0 pass, 1 fail, 2 bad arguments or an
unreadable run directory.

The gate fails when any of these holds (quarantined cases are left out of every count):

- the flaky rate, (flaky + verdict_flaky) / cases, exceeds `--max-flaky-rate`;
- more cases than `--max-verdict-flips` change their pass/fail verdict across compositions;
- with `--baseline`: a case newly diverges (stable or fragile in the baseline, flaky or
  verdict_flaky now), or with `--fail-on-new-fragile` newly becomes fragile (stable before);
- a quarantine entry has expired;
- with `--max-score-swing PP`: the score swing exceeds PP percentage points. The swing is the best-case
  minus the worst-case score over the graded cases (a case passes in the worst case only if it passes
  under every composition, in the best case if it passes under any; see flakecheck.analysis.score_swing): how far
  the suite's reported score can move from batch composition alone. No limit unless given;
- with `--max-flip-probability P` (a run with draws: `flakecheck run --sample N`, or a probe): a case's
  flip probability is shown to exceed P — the lower bound of its exact 95% interval is above P. A case
  whose interval straddles P is not failed but named as undecided (more draws would decide it: `--repeat
  auto` spends them there), so a few unlucky draws of a rarely flipping case do not fail the build;
- with `--max-score-std PP`: the score's standard deviation over the draws exceeds PP percentage points;
- with `--min-pass-rate R`: a graded case passes in fewer than R of its runs (every composition and repeat;
  promptfoo's per-test threshold under `--repeat`). `--min-pass-rate 1` is pass^k: the case must pass all k
  of its runs.

Defaults when a threshold is not given:

- without `--baseline`: `--max-flaky-rate 0` and `--max-verdict-flips 0`. Strict on purpose: the
  run a CI gates is normally the fixed-order (`--kernels invariant`) one, where nothing may flip;
  a production-like `splitk` run is gated with explicit budgets.
- with `--baseline`: the baseline's own flaky rate and verdict-flip count ("no worse than the
  baseline"), so known flakiness does not fail while every newly diverging case does.

Quarantined cases (see flakecheck.gate.quarantine) are reported and appear as `skipped` in JUnit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from flakecheck.analysis.flip.score import score_distribution
from flakecheck.analysis.score_swing import score_swing, swing_sentence
from flakecheck.console import output_console
from flakecheck.data.rundir import RunData, load_run
from flakecheck.errors import UserError
from flakecheck.gate.junit import junit_text
from flakecheck.gate.markdown import gate_markdown, pass_rate_line, score_swing_line
from flakecheck.gate.quarantine import QuarantineEntry, load_quarantine
from flakecheck.gate.result import CaseOutcome, GateResult, GateSettings
from flakecheck.reports.facts import DIVERGED, RunFacts, gather
from flakecheck.reports.formats import JUNIT, MARKDOWN, TERMINAL, choose_outputs, write_files

# Rates are compared with a little slack so "no worse than the baseline" holds for equal counts.
RATE_EPSILON = 1e-9


def gate_command(run_dir: Path, baseline: Path | None, max_flaky_rate: float | None,
                 max_verdict_flips: int | None, fail_on_new_fragile: bool, quarantine: Path | None,
                 junit: Path | None, markdown: Path | None, max_score_swing: float | None = None,
                 max_flip_probability: float | None = None, max_score_std: float | None = None,
                 min_pass_rate: float | None = None, formats: Sequence[str] = ()) -> int:
    """`formats`: --format's entries; `junit` and `markdown`: the old --junit PATH and --markdown PATH."""
    outputs = choose_outputs(formats, "gate", files={JUNIT.name: junit, MARKDOWN.name: markdown})
    if max_flaky_rate is not None and not 0.0 <= max_flaky_rate <= 1.0:
        raise UserError(f"--max-flaky-rate must be between 0 and 1, got {max_flaky_rate}")
    if max_verdict_flips is not None and max_verdict_flips < 0:
        raise UserError(f"--max-verdict-flips must be >= 0, got {max_verdict_flips}")
    if max_score_swing is not None and not 0.0 <= max_score_swing <= 100.0:
        raise UserError(f"--max-score-swing is in percentage points, between 0 and 100; got {max_score_swing}")
    if max_flip_probability is not None and not 0.0 <= max_flip_probability <= 1.0:
        raise UserError(f"--max-flip-probability must be between 0 and 1, got {max_flip_probability}")
    if max_score_std is not None and not 0.0 <= max_score_std <= 100.0:
        raise UserError(f"--max-score-std is in percentage points, between 0 and 100; got {max_score_std}")
    if min_pass_rate is not None and not 0.0 <= min_pass_rate <= 1.0:
        raise UserError(f"--min-pass-rate must be between 0 and 1 (1: pass^k, every run passes), got {min_pass_rate}")
    if fail_on_new_fragile and baseline is None:
        raise UserError("--fail-on-new-fragile needs --baseline RUN_DIR to compare against")
    run = load_run(run_dir)
    if (max_flip_probability is not None or max_score_std is not None) and gather(run).flip is None:
        flag = "--max-flip-probability" if max_flip_probability is not None else "--max-score-std"
        raise UserError(f"{flag}: {run_dir} has no draws to measure it on (run it with `flakecheck run --sample N`, "
                        f"or probe a server with --repeat N)")
    base = load_run(baseline) if baseline is not None else None
    entries = load_quarantine(quarantine) if quarantine is not None else []
    result = evaluate(run, base, entries, max_flaky_rate, max_verdict_flips, fail_on_new_fragile, date.today(),
                      max_score_swing=max_score_swing, max_flip_probability=max_flip_probability,
                      max_score_std=max_score_std, min_pass_rate=min_pass_rate)
    text = gate_markdown(result)
    renderers = {MARKDOWN.name: lambda: text, JUNIT.name: lambda: junit_text(result)}
    write_files(outputs, renderers)
    _append_step_summary(text)
    if outputs.stdout == TERMINAL.name:
        print_result(result, output_console())
    else:
        sys.stdout.write(renderers[outputs.stdout]())
    return 0 if result.passed else 1


def evaluate(run: RunData, baseline: RunData | None, entries: list[QuarantineEntry],
             max_flaky_rate: float | None, max_verdict_flips: int | None, fail_on_new_fragile: bool,
             today: date, max_score_swing: float | None = None, max_flip_probability: float | None = None,
             max_score_std: float | None = None, min_pass_rate: float | None = None) -> GateResult:
    """The gate's decision over a run (and optionally a baseline), without side effects."""
    facts = gather(run)
    active = {e.case_id: e for e in entries if not e.expired(today)}
    expired = {e.case_id: e for e in entries if e.expired(today)}
    judged = [c for c in facts.cases if str(c["case_id"]) not in active]
    n_flaky, n_flips = _flaky_counts(judged)
    rate = n_flaky / len(judged) if judged else 0.0
    base_status: dict[str, str] = {}
    settings = GateSettings(
        max_flaky_rate if max_flaky_rate is not None else 0.0,
        max_verdict_flips if max_verdict_flips is not None else 0,
        fail_on_new_fragile,
        max_score_swing=max_score_swing, max_flip_probability=max_flip_probability, max_score_std=max_score_std,
        min_pass_rate=min_pass_rate,
    )
    score_std = _score_std(facts, set(active))
    std_fails = max_score_std is not None and score_std is not None and score_std > max_score_std + RATE_EPSILON
    score = score_swing({c: v for c, v in facts.verdicts.items() if c not in active}, facts.run_labels,
                        facts.swing_cause)
    swing_fails = (max_score_swing is not None and score.swing_pp is not None
                   and score.swing_pp > max_score_swing + RATE_EPSILON)
    notes: list[str] = []
    if baseline is not None:
        base_facts = gather(baseline)
        base_status = {str(c["case_id"]): c["status"] for c in base_facts.cases}
        base_judged = [c for c in base_facts.cases if str(c["case_id"]) not in active]
        base_flaky, base_flips = _flaky_counts(base_judged)
        if max_flaky_rate is None:
            settings.max_flaky_rate = base_flaky / len(base_judged) if base_judged else 0.0
            settings.rate_from_baseline = True
        if max_verdict_flips is None:
            settings.max_verdict_flips = base_flips
            settings.flips_from_baseline = True
        if base_facts.record.suite_sha256 != facts.record.suite_sha256:
            notes.append("the baseline was run on a different suite file (suite_sha256 differs); "
                         "cases are matched by id")
        missing = sorted(set(base_status) - {str(c["case_id"]) for c in facts.cases})
        if missing:
            notes.append(f"{len(missing)} baseline case(s) are not in this run: {', '.join(missing[:10])}")
    rate_fails = rate > settings.max_flaky_rate + RATE_EPSILON
    flips_fail = n_flips > settings.max_verdict_flips
    outcomes = []
    new_divergent, new_fragile = [], []
    for c in facts.cases:
        case_id = str(c["case_id"])
        before = base_status.get(case_id)
        outcome = CaseOutcome(c, "pass", baseline_status=before, passes=pass_counts(facts.verdicts.get(case_id, {})))
        if case_id in active:
            outcome.outcome, outcome.quarantine = "quarantined", active[case_id]
            outcomes.append(outcome)
            continue
        if case_id in expired:
            e = expired[case_id]
            outcome.reasons.append(f"its quarantine entry expired on {e.expires.isoformat()}")
        if before in ("stable", "fragile") and c["status"] in DIVERGED:
            new_divergent.append(case_id)
            outcome.reasons.append(f"newly diverges: {before} in the baseline, {c['status']} now")
        if before == "stable" and c["status"] == "fragile":
            new_fragile.append(case_id)
            if fail_on_new_fragile:
                outcome.reasons.append("newly fragile: stable in the baseline, a near-tie now")
        if c["verdict_flip"] and flips_fail:
            outcome.reasons.append(f"its verdict flips ({n_flips} flips > max {settings.max_verdict_flips})")
        if c["status"] in DIVERGED and rate_fails:
            outcome.reasons.append(f"flaky rate {rate:.1%} > max {settings.max_flaky_rate:.1%}")
        low = c.get("p_flip_low")
        if max_flip_probability is not None and low is not None and low > max_flip_probability + RATE_EPSILON:
            outcome.reasons.append(f"it flips in at least {low:.0%} of draws (observed {c['p_flip']:.0%} of "
                                   f"{c['n_draws']}, 95% lower bound) > max {max_flip_probability:.0%}")
        passes = outcome.passes
        if min_pass_rate is not None and passes is not None and passes[0] < min_pass_rate * passes[1] - RATE_EPSILON:
            outcome.reasons.append(f"{pass_k_words(*passes)} < min pass rate {min_pass_rate:.0%}")
        if c["verdict_flip"] and swing_fails:
            outcome.reasons.append(f"its verdict flip moves the score (swing {score.swing_pp:.1f} pp > max "
                                   f"{max_score_swing:g} pp)")
        if outcome.reasons:
            outcome.outcome = "fail"
        elif c["status"] in DIVERGED:
            outcome.outcome = "flaky"
        outcomes.append(outcome)
    failures = _failures(rate, rate_fails, n_flips, flips_fail, settings, new_divergent, new_fragile,
                         list(expired.values()))
    if swing_fails:
        failures.append(f"score swing {score.swing_pp:.1f} pp exceeds the maximum {max_score_swing:g} pp: "
                        f"{swing_sentence(score)}")
    too_likely = [o.case_id for o in outcomes if any(r.startswith("it flips in at least") for r in o.reasons)]
    if too_likely:
        failures.append(f"{len(too_likely)} case(s) flip more often than {max_flip_probability:.0%} of draws "
                        f"(the 95% lower bound is above it): {', '.join(too_likely[:10])}"
                        f"{' …' if len(too_likely) > 10 else ''}")
    if max_flip_probability is not None:
        undecided = [o.case_id for o in outcomes if o.outcome != "quarantined"
                     and _straddles(o.case, max_flip_probability)]
        if undecided:
            notes.append(f"{len(undecided)} case(s) undecided against {max_flip_probability:.0%}: their 95% interval "
                         f"holds it (not failed; more draws would decide): {', '.join(undecided[:10])}"
                         f"{' …' if len(undecided) > 10 else ''}")
    below = [o.case_id for o in outcomes if any("< min pass rate" in r for r in o.reasons)]
    if below:
        failures.append(f"{len(below)} case(s) pass in fewer than {min_pass_rate:.0%} of their runs"
                        f"{' (pass^k: every run must pass)' if min_pass_rate == 1 else ''}: "
                        f"{', '.join(below[:10])}{' …' if len(below) > 10 else ''}")
    if std_fails:
        failures.append(f"the score's standard deviation over the draws, {score_std:.2f} pp, exceeds the maximum "
                        f"{max_score_std:g} pp")
    known = {str(c["case_id"]) for c in facts.cases}
    return GateResult(
        facts=facts, settings=settings, failures=failures, outcomes=outcomes, flaky_rate=rate,
        n_judged=len(judged), n_flaky=n_flaky, n_verdict_flips=n_flips, new_divergent=new_divergent,
        new_fragile=new_fragile, expired=list(expired.values()),
        unknown_quarantined=sorted(i for i in active if i not in known),
        baseline=baseline.path if baseline is not None else None, score=score, notes=notes,
        score_std_pp=score_std,
    )


def _straddles(case: dict[str, Any], threshold: float) -> bool:
    low, high = case.get("p_flip_low"), case.get("p_flip_high")
    return low is not None and high is not None and low <= threshold + RATE_EPSILON and high > threshold


def pass_counts(verdicts: dict[str, bool | None]) -> tuple[int, int] | None:
    """(runs passed, runs graded) of one case over every composition and repeat; None when none was graded."""
    graded = [v for v in verdicts.values() if v is not None]
    return (sum(graded), len(graded)) if graded else None


def pass_k_words(passed: int, runs: int) -> str:
    """'passed 2 of 3 runs (pass^3 no)' — promptfoo's words for a case under --repeat."""
    return f"passed {passed} of {runs} runs (pass^{runs} {'yes' if passed == runs else 'no'})"


def _score_std(facts: RunFacts, quarantined: set[str]) -> float | None:
    """The score's standard deviation over the run's draws in percentage points, quarantined cases left out."""
    draws = set(facts.record.draws)
    labels = [label for label in facts.run_labels if label.split(" #")[0] in draws]
    if not labels:
        return None
    verdicts = {c: v for c, v in facts.verdicts.items() if c not in quarantined}
    std = score_distribution(verdicts, labels, facts.reference).std
    return None if std is None else 100.0 * std


def _flaky_counts(cases: list[dict[str, Any]]) -> tuple[int, int]:
    return (sum(c["status"] in DIVERGED for c in cases), sum(bool(c["verdict_flip"]) for c in cases))


def _failures(rate: float, rate_fails: bool, n_flips: int, flips_fail: bool, settings: GateSettings,
              new_divergent: list[str], new_fragile: list[str], expired: list[QuarantineEntry]) -> list[str]:
    failures = []
    if rate_fails:
        source = " (the baseline's)" if settings.rate_from_baseline else ""
        failures.append(f"flaky rate {rate:.1%} exceeds the maximum {settings.max_flaky_rate:.1%}{source}")
    if flips_fail:
        source = " (the baseline's)" if settings.flips_from_baseline else ""
        failures.append(f"{n_flips} verdict flip(s) exceed the maximum {settings.max_verdict_flips}{source}")
    if new_divergent:
        failures.append(f"{len(new_divergent)} case(s) newly diverge against the baseline: "
                        f"{', '.join(new_divergent[:10])}{' …' if len(new_divergent) > 10 else ''}")
    if new_fragile and settings.fail_on_new_fragile:
        failures.append(f"{len(new_fragile)} case(s) are newly fragile: {', '.join(new_fragile[:10])}"
                        f"{' …' if len(new_fragile) > 10 else ''}")
    for e in expired:
        failures.append(f"quarantine entry for {e.case_id!r} (line {e.line}) expired on {e.expires.isoformat()}")
    return failures


def _append_step_summary(text: str) -> None:
    """GitHub Actions shows $GITHUB_STEP_SUMMARY on the run page; append, never fail the gate over it."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as exc:
        print(f"warning: cannot append to GITHUB_STEP_SUMMARY ({exc})", file=sys.stderr)


def print_result(result: GateResult, console: Console) -> None:
    facts = result.facts
    verdict = "[bold green]PASSED[/]" if result.passed else "[bold red]FAILED[/]"
    console.print(f"flakecheck gate {verdict}: {escape(facts.suite_name)} ({facts.n_cases} cases, "
                  f"kernels {escape(facts.policy)}) — {escape(str(facts.path))}")
    s = result.settings
    console.print(f"  flaky rate {result.flaky_rate:.1%} (max {s.max_flaky_rate:.1%}"
                  f"{', from the baseline' if s.rate_from_baseline else ''}) · verdict flips "
                  f"{result.n_verdict_flips} (max {s.max_verdict_flips}"
                  f"{', from the baseline' if s.flips_from_baseline else ''})")
    console.print(f"  {escape(score_swing_line(result))}")
    if s.max_flip_probability is not None or s.max_score_std is not None:
        highest = max((c.get("p_flip_low") or 0.0 for c in facts.cases), default=0.0)
        std = "—" if result.score_std_pp is None else f"{result.score_std_pp:.2f} pp"
        console.print(f"  flip probability: highest 95% lower bound {highest:.0%}"
                      f"{'' if s.max_flip_probability is None else f' (max {s.max_flip_probability:.0%})'} · "
                      f"score std over the draws {std}"
                      f"{'' if s.max_score_std is None else f' (max {s.max_score_std:g} pp)'}")
    if s.min_pass_rate is not None:
        console.print(f"  {escape(pass_rate_line(result))}")
    if result.baseline is not None:
        console.print(f"  baseline {escape(str(result.baseline))}: {len(result.new_divergent)} newly divergent, "
                      f"{len(result.new_fragile)} newly fragile")
    for failure in result.failures:
        console.print(f"  [red]✗[/] {escape(failure)}")
    for o in result.with_outcome("quarantined"):
        q = o.quarantine
        assert q is not None
        console.print(f"  [dim]quarantined {escape(o.case_id)} ({o.case['status']}) until "
                      f"{q.expires.isoformat()}: {escape(q.reason)}[/]")
    for case_id in result.unknown_quarantined:
        console.print(f"  [yellow]note:[/] quarantined id {escape(case_id)} is not in this run")
    for note in result.notes:
        console.print(f"  [yellow]note:[/] {escape(note)}")
