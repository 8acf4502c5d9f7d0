"""The diff as one self-contained HTML page (`--html FILE`): report.css inline, no script, a CSP that forbids
every fetch, and all suite and model text through jinja2's autoescaping."""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from flakecheck.diff.classify import CLASSES
from flakecheck.diff.facts import listed, mixed_line, rate, reference_change, side_line
from flakecheck.diff.result import DiffResult
from flakecheck.diff.score import change_sentence
from flakecheck.reports.html import TEMPLATES

TEXT_CHARS = 2000  # of each reference answer shown


def render_diff_html(result: DiffResult) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    cases = listed(result) + result.of_kind("same")
    return env.get_template("diff.html.j2").render(
        result=result, classes=CLASSES, cases=cases, side_a=side_line(result.a), side_b=side_line(result.b),
        score_sentence=change_sentence(result.score), mixed=mixed_line(result.score), rate=rate,
        reference_change=reference_change, cut=_cut, css=Markup((TEMPLATES / "report.css").read_text()))


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + f"… [{len(text) - TEXT_CHARS} more characters]"
