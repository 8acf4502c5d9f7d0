"""report.html without a browser: escaping, self-containment, the size bound, token hover text."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from flakecheck.reports.html import HtmlLimits, render_html, script_json, write_html
from tests.fixtures_runs import *  # noqa: F403
from tests.fixtures_runs import SCRIPT_PROMPT


class Collector(HTMLParser):
    """Script bodies, elements by class, and every URL-bearing attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.urls: list[str] = []
        self.classes: list[str] = []
        self.rows = 0
        self._in_script = False
        self._in_tbody = False

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        self.classes.append(f"{tag}.{a.get('class', '')}")
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "data") and v]
        if tag == "link":
            self.urls.append(a.get("href", "<link>"))
        self._in_script = tag == "script"
        if tag == "script":
            self.scripts.append("")
        self._in_tbody = self._in_tbody or tag == "tbody"
        if tag == "tr" and self._in_tbody:
            self.rows += 1

    def handle_endtag(self, tag) -> None:
        self._in_script = False if tag == "script" else self._in_script
        self._in_tbody = False if tag == "tbody" else self._in_tbody

    def handle_data(self, data) -> None:
        if self._in_script:
            self.scripts[-1] += data


def parse(html: str) -> Collector:
    collector = Collector()
    collector.feed(html)
    return collector


def test_script_in_a_prompt_is_text_not_markup(splitk_report_run) -> None:
    html = (splitk_report_run.path / "report.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html
    page = parse(html)
    assert len(page.scripts) == 2  # the data blob and the report's own code, nothing from the suite
    assert all("alert(1)" not in s for s in page.scripts)


def test_json_in_script_cannot_close_the_tag() -> None:
    payload = {"prompt": SCRIPT_PROMPT + "</script><!--", "n": [1, 2]}
    text = str(script_json(payload))
    assert "<" not in text and ">" not in text and "&" not in text.replace("\\u0026", "")
    assert json.loads(text) == payload


def test_report_is_self_contained(splitk_report_run) -> None:
    html = (splitk_report_run.path / "report.html").read_text()
    page = parse(html)
    assert all(url.startswith("#") for url in page.urls), page.urls  # only in-page anchors
    assert "default-src 'none'" in html  # and the browser is told to refuse any fetch


def test_every_case_has_a_row_and_detail_is_bounded(splitk_report_run) -> None:
    cases = splitk_report_run.cases
    full = parse(render_html(splitk_report_run))
    assert full.rows == len(cases)
    limits = HtmlLimits(detail_cases=1, tokens_per_output=2, alternatives_per_case=1, text_chars=20)
    small_html = render_html(splitk_report_run, limits)
    small = parse(small_html)
    assert small.rows == len(cases)
    assert small.classes.count("details.case") == min(1, int((cases.status != "stable").sum()))
    for output in re.findall(r'<div class="tokens">(.*?)</div>', small_html, flags=re.S):
        assert output.count('class="tok') <= limits.tokens_per_output
    assert len(small_html) <= len(render_html(splitk_report_run))


def test_tokens_carry_both_candidates_and_their_logprobs(splitk_report_run) -> None:
    html = render_html(splitk_report_run)
    tips = re.findall(r'data-tip="([^"]*)"', html)
    if (splitk_report_run.cases.status != "stable").any():
        assert tips
    for tip in tips:
        assert "gap" in tip and "1st:" in tip and "2nd:" in tip
        assert re.search(r"1st: .+ \(-?\d+\.\d{3}\)", tip) and re.search(r"2nd: .+ \(-?\d+\.\d{3}\)", tip)


def test_divergence_is_marked_in_reference_and_alternative(splitk_report_run) -> None:
    diverged = splitk_report_run.cases[splitk_report_run.cases.first_divergence.notna()]
    html = render_html(splitk_report_run)
    # each shown alternative marks its first differing token, and the reference marks the same step
    outputs = re.findall(r'<div class="tokens">(.*?)</div>', html, flags=re.S)
    marks = sum(len(re.findall(r'class="tok [^"]*\bdiv\b', o)) for o in outputs)
    if len(diverged) == 0:
        assert marks == 0
    else:
        assert marks >= 2
        assert "alternative 1" in html


def test_write_html_is_atomic_and_leaves_no_temp_files(splitk_report_run, tmp_path) -> None:
    target = tmp_path / "r.html"
    write_html(splitk_report_run, target)
    assert target.read_text().rstrip().endswith("</html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
