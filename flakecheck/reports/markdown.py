"""The markdown report (`flakecheck report --format markdown`, PR comments, the gate's step summary).

GitHub renders raw HTML inside markdown, so every piece of suite or model text is HTML-escaped and
stripped of what would break a table cell.
"""

from __future__ import annotations

import html

from flakecheck.analysis.score_swing import swing_sentence
from flakecheck.data.rundir import STATUSES, RunData
from flakecheck.reports.explanation import Explanation, explanation, fmt_cost, mechanism_counts, stabilised
from flakecheck.reports.facts import (
    CONFIDENT_NOTE,
    TP_ONLY_NOTE,
    RunFacts,
    empty_answer_warning,
    flip_summary,
    fmt_gap,
    fmt_rate,
    fmt_step,
    gather,
    next_command,
    score_range,
)
from flakecheck.reports.flip_view import fmt_observed, fmt_predicted, prediction_note

MARKDOWN_SPECIALS = str.maketrans({c: f"\\{c}" for c in "\\`*_[]|~"})


def md_text(value: object, limit: int = 200) -> str:
    """Suite/model text safe inside a markdown table cell: no HTML, no markup, one line, bounded."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[:limit] + "…"
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return html.escape(text, quote=False).translate(MARKDOWN_SPECIALS)


def md_token(value: str | None) -> str:
    return "?" if value is None else md_text(repr(value), limit=60)


def render_markdown(run: RunData, top: int = 10) -> str:
    return markdown_from_facts(gather(run), top, explanation(run))


def markdown_from_facts(facts: RunFacts, top: int = 10, explained: Explanation | None = None) -> str:
    lines = [f"## flakecheck: {md_text(facts.suite_name)}", ""]
    lines += header_lines(facts)
    lines += ["", "| status | cases | share |", "|---|---:|---:|"]
    for status in STATUSES:
        share = facts.counts[status] / facts.n_cases if facts.n_cases else 0.0
        lines.append(f"| {status} | {facts.counts[status]} | {fmt_rate(share)} |")
    lines.append("")
    warning = empty_answer_warning(facts)
    if warning:
        lines += [f"> **Warning:** {md_text(warning, 500)}", ""]
    if facts.verdict_flips:
        ids = ", ".join(md_text(c, 80) for c in facts.verdict_flips[:50])
        more = f" (+{len(facts.verdict_flips) - 50} more)" if len(facts.verdict_flips) > 50 else ""
        lines.append(f"**Verdict flips ({len(facts.verdict_flips)}):** {ids}{more}")
    else:
        lines.append("**No verdict flips.**")
    if facts.tp_only_flips:
        ids = ", ".join(md_text(c, 80) for c in facts.tp_only_flips[:50])
        more = f" (+{len(facts.tp_only_flips) - 50} more)" if len(facts.tp_only_flips) > 50 else ""
        lines += ["", f"**TP-only flips ({len(facts.tp_only_flips)}):** {ids}{more} — {TP_ONLY_NOTE}."]
    lines += ["", *score_and_flip_lines(facts)]
    risky = facts.top(top)
    if risky:
        lines += ["", f"### Top {len(risky)} cases by flip probability", ""]
        lines += risk_table(risky)
    lines += ["", "### Per composition", "", "| composition | diverged cases | verdict changes | score |",
              "|---|---:|---:|---:|"]
    scores = facts.score.per_composition
    for c in facts.compositions:
        label = md_text(facts.composition_label(c)) + (" (reference)" if c.is_reference else "")
        lines.append(f"| {label} | {c.diverged_cases} | {c.verdict_changes} | {fmt_rate(scores.get(c.name))} |")
    if explained is not None:
        lines += explanation_lines(explained, top)
    why, command = next_command(facts)
    lines += ["", f"Next, {why}:", "", "```", command.replace("`", "'"), "```", ""]
    return "\n".join(lines)


def header_lines(facts: RunFacts) -> list[str]:
    compositions = ", ".join(md_text(facts.composition_label(c)) for c in facts.compositions)
    return [
        f"- **{facts.n_cases} cases**, flaky rate {fmt_rate(facts.flaky_rate)} "
        f"({facts.n_diverged} flaky or verdict_flaky)",
        f"- model {md_text(facts.model)} · {md_text(facts.dtype)} · kernels **{md_text(facts.policy)}** "
        f"({md_text(facts.runs_on)}, profile {md_text(facts.profile)})",
        *([f"- machine: {md_text(facts.engine.verified, 400)}"] if facts.engine.verified else []),
        f"- compositions: {compositions} (reference {md_text(facts.reference)})",
        f"- near-tie threshold {facts.gap_threshold:g} over the first {facts.gap_window} tokens",
        f"- run directory: {md_text(facts.path, 300)}",
    ]


def score_and_flip_lines(facts: RunFacts) -> list[str]:
    """The score swing and the kinds of first flips, as markdown lines (none when there is nothing to say)."""
    lines = []
    score = facts.score
    if score.n_graded and not score.swing_pp:
        lines.append(f"- **Score swing:** {swing_sentence(score)} ({score.n_graded} graded cases).")
    elif score.n_graded:
        lines.append(f"- **Score swing:** {swing_sentence(score)} (worst case: a case passes only if it passes "
                     f"under every composition; best case: under any). Per composition: {score_range(score)}; "
                     f"{score.n_graded} graded cases.")
    flips = flip_summary(facts)
    if flips:
        lines.append(f"- {flips.capitalize()}.")
    if facts.confident_flips:
        ids = ", ".join(md_text(c, 80) for c in facts.confident_flips[:50])
        lines.append(f"- **Confident flips ({len(facts.confident_flips)}):** {ids} — {CONFIDENT_NOTE}.")
    note = prediction_note(facts.record.flip)
    if note:
        lines.append(f"- {md_text(note, 1000)}")
    view = facts.flip
    if view is not None:
        lines += [f"- {md_text(line, 1000)}" for line in view.lines()]
    return lines


def risk_table(risky: list[dict]) -> list[str]:
    lines = ["| case | status | p flip [95%] | predicted | first divergence | where | tokens (ref → alt) | gap "
             "| flip | min gap | pass rate |",
             "|---|---|---:|---:|---:|---|---|---:|---|---:|---:|"]
    for c in risky:
        pair = "—"
        if c["ref_token"] is not None or c["alt_token"] is not None:
            pair = f"{md_token(c['ref_token'])} → {md_token(c['alt_token'])}"
        lines.append(
            f"| {md_text(c['case_id'], 80)} | {c['status']} | {fmt_observed(c)} | {fmt_predicted(c)} "
            f"| {fmt_step(c['first_divergence'])} "
            f"| {md_text(c['divergence_composition'] or '—')} | {pair} | {fmt_gap(c['gap_at_divergence'])} "
            f"| {c.get('flip_kind') or '—'} | {fmt_gap(c['min_gap'])} | {fmt_rate(c['pass_rate'])} |"
        )
    return lines


def explanation_lines(facts: Explanation, top: int = 10) -> list[str]:
    """`flakecheck explain`'s findings: the mechanism counts, the cases, the ranked fixes."""
    lines = ["", "### Why they flipped", ""]
    if not facts.cases:
        return lines + ["No diverged case to explain."]
    lines += [f"Each diverged case replayed to its first divergence + {facts.steps_after} steps with one mechanism "
              "variable; cases each mechanism alone reproduces, of those where it varies: "
              f"{md_text(mechanism_counts(facts), 600)}.", "",
              "| case | step | where | kernels | scheduling |", "|---|---:|---|---|---|"]
    for case in facts.cases[:max(top, 0)]:
        lines.append(f"| {md_text(case.case_id, 80)} | {fmt_step(case.step)} | {md_text(case.where or '—')} "
                     f"| {md_text(case.reduction or '—')} | {md_text(case.scheduling or '—')} |")
    if len(facts.cases) > top:
        lines.append(f"| … {len(facts.cases) - top} more in attribution.parquet | | | | |")
    if facts.fixes:
        lines += ["", "### Smallest fix (replayed; cheapest full fix first)", "",
                  "| # | fix | stabilises | verdict flips | cost | what was measured | vLLM | SGLang |",
                  "|---:|---|---:|---:|---:|---|---|---|"]
        for fix in facts.fixes:
            lines.append(f"| {fix['rank']} | {md_text(fix['label'])} | {stabilised(fix)} "
                         f"| {fix['verdict_flips_before']} → {fix['verdict_flips_after']} | {fmt_cost(fix)} "
                         f"| {md_text(fix['cost'], 400)} | {md_text(fix['vllm'])} | {md_text(fix['sglang'])} |")
    line = facts.cost_line()
    if line:
        lines += ["", md_text(line, 400)]
    return lines
