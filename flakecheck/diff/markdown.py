"""The diff in markdown (`--markdown FILE`, and $GITHUB_STEP_SUMMARY): the verdict and the score change first,
the case lists collapsed in <details> and capped, every piece of suite or model text escaped."""

from __future__ import annotations

from flakecheck.diff.classify import CLASSES
from flakecheck.diff.facts import listed, mixed_line, rate, reference_change, side_line
from flakecheck.diff.result import DiffResult
from flakecheck.diff.score import change_sentence
from flakecheck.reports.markdown import md_text

MAX_ROWS = 50


def diff_markdown(result: DiffResult) -> str:
    mark = "✅ passed" if result.passed else "❌ failed"
    lines = [f"### flakecheck diff {mark}", "",
             f"- **A** {md_text(side_line(result.a), 400)}", f"- **B** {md_text(side_line(result.b), 400)}", "",
             f"**{md_text(change_sentence(result.score), 500)}**", ""]
    mixed = mixed_line(result.score)
    if mixed:
        lines += [md_text(mixed, 400), ""]
    lines += [md_text(result.raw_sentence(), 400), "", "| class | cases |", "|---|---:|"]
    lines += [f"| {kind} | {result.counts[kind]} |" for kind in CLASSES]
    if result.noise_line():
        lines += ["", md_text(result.noise_line(), 300)]
    if result.failures:
        lines += ["", "**Why it failed:**", ""] + [f"- {md_text(f, 500)}" for f in result.failures]
    for note in result.notes:
        lines += ["", f"> **Note:** {md_text(note, 500)}"]
    cases = listed(result)
    if cases:
        rows = ["| case | class | A pass | B pass | reference A → B | why |", "|---|---|---:|---:|---|---|"]
        rows += [f"| {md_text(c.label, 80)} | {c.kind} | {rate(c.passed_a, c.graded_a)} | "
                 f"{rate(c.passed_b, c.graded_b)} | {reference_change(c)} | {md_text(c.why, 300)} |"
                 for c in cases[:MAX_ROWS]]
        more = ["", f"… and {len(cases) - MAX_ROWS} more (the JSON output lists every case)"] \
            if len(cases) > MAX_ROWS else []
        lines += ["", "<details>", f"<summary>Cases that differ ({len(cases)})</summary>", "", *rows, *more, "",
                  "</details>"]
    return "\n".join(lines) + "\n"
