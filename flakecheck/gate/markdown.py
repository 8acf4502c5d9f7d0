"""The gate's markdown summary (`--markdown FILE` and $GITHUB_STEP_SUMMARY): a short verdict first,
the case lists collapsed in <details>, every list capped so the text stays far below GitHub's
1 MiB step-summary limit."""

from __future__ import annotations

from flakecheck.analysis.score_swing import swing_sentence
from flakecheck.data.rundir import STATUSES
from flakecheck.gate.result import GateResult
from flakecheck.reports.markdown import md_text, risk_table

MAX_ROWS = 50
MAX_CHARS = 100_000


def score_swing_line(result: GateResult) -> str:
    """'score swing 12.0 pp (max 5 pp): your reported score can move from ...' for the gate's outputs."""
    score, limit = result.score, result.settings.max_score_swing
    if score.swing_pp is None:
        return "score swing: no graded cases"
    bound = f"max {limit:g} pp" if limit is not None else "not gated; --max-score-swing PP"
    return f"score swing {score.swing_pp:.1f} pp ({bound}): {swing_sentence(score)}"


def pass_rate_line(result: GateResult) -> str:
    """'pass^k: 5 of 8 graded cases passed every run; lowest pass rate 33% (min 100%)' for the gate's outputs."""
    graded = [o for o in result.outcomes if o.passes is not None and o.outcome != "quarantined"]
    if not graded:
        return "pass rate per case: no graded cases"
    k = sorted({o.passes[1] for o in graded if o.passes is not None})
    lowest = min(o.passes[0] / o.passes[1] for o in graded if o.passes is not None)
    limit = result.settings.min_pass_rate
    bound = f"min {limit:.0%}" if limit is not None else "not gated; --min-pass-rate R"
    runs = f"{k[0]}" if len(k) == 1 else f"{k[0]}-{k[-1]}"
    return (f"pass^k over {runs} runs per case: {sum(bool(o.pass_k) for o in graded)} of {len(graded)} graded cases "
            f"passed every run; lowest pass rate {lowest:.0%} ({bound})")


def gate_markdown(result: GateResult) -> str:
    facts, s = result.facts, result.settings
    mark = "✅ passed" if result.passed else "❌ failed"
    lines = [f"### flakecheck gate {mark}: {md_text(facts.suite_name)}", ""]
    counts = " · ".join(f"{facts.counts[st]} {st}" for st in STATUSES)
    lines.append(f"{facts.n_cases} cases · {counts} · kernels **{md_text(facts.policy)}** "
                 f"({len(facts.compositions)} compositions, model {md_text(facts.model)})")
    lines.append("")
    lines.append(f"- flaky rate **{result.flaky_rate:.1%}** (max {s.max_flaky_rate:.1%}"
                 f"{', from the baseline' if s.rate_from_baseline else ''})")
    lines.append(f"- verdict flips **{result.n_verdict_flips}** (max {s.max_verdict_flips}"
                 f"{', from the baseline' if s.flips_from_baseline else ''})")
    lines.append(f"- {md_text(score_swing_line(result), 500)}")
    if s.min_pass_rate is not None:
        lines.append(f"- {md_text(pass_rate_line(result), 500)}")
    if result.baseline is not None:
        lines.append(f"- against the baseline: {len(result.new_divergent)} newly divergent, "
                     f"{len(result.new_fragile)} newly fragile")
    quarantined = result.with_outcome("quarantined")
    if quarantined or result.expired:
        lines.append(f"- quarantine: {len(quarantined)} case(s) held, {len(result.expired)} expired entry(ies)")
    if result.failures:
        lines += ["", "**Why it failed:**", ""]
        lines += [f"- {md_text(f, 500)}" for f in result.failures]
    sections = [
        ("Cases failing the gate", result.with_outcome("fail")),
        ("Flaky cases the gate tolerates", result.with_outcome("flaky")),
    ]
    for title, outcomes in sections:
        if outcomes:
            lines += _collapsed(f"{title} ({len(outcomes)})", risk_table([o.case for o in outcomes[:MAX_ROWS]]),
                                len(outcomes))
    if quarantined:
        rows = ["| case | status | expires | reason |", "|---|---|---|---|"]
        for o in quarantined[:MAX_ROWS]:
            q = o.quarantine
            assert q is not None
            rows.append(f"| {md_text(o.case_id, 80)} | {o.case['status']} | {q.expires.isoformat()} "
                        f"| {md_text(q.reason)} |")
        lines += _collapsed(f"Quarantined ({len(quarantined)})", rows, len(quarantined))
    lines += ["", f"Run directory: {md_text(facts.path, 300)} — open its report.html for token detail.", ""]
    text = "\n".join(lines)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + "\n\n… (cut; the full lists are in the JUnit XML and the run directory)\n"
    return text


def _collapsed(title: str, rows: list[str], total: int) -> list[str]:
    more = ["", f"… and {total - MAX_ROWS} more"] if total > MAX_ROWS else []
    return ["", "<details>", f"<summary>{title}</summary>", "", *rows, *more, "", "</details>"]
