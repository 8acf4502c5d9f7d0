"""Every report format renders from any run directory (issue 11): property tests over constructed runs with
outputs of 0, 1 and many tokens, empty answers, all-stable / all-flaky / mixed suites, cases without checks,
and non-ASCII and `<script>` text in ids, prompts and tokens."""

from __future__ import annotations

import io
import json
import tempfile
import xml.etree.ElementTree as ET
from datetime import date
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from rich.console import Console

from flakecheck.analysis.flip_kind import FLIP_KINDS
from flakecheck.data.rundir import STATUSES, RunData
from flakecheck.gate.gate import evaluate
from flakecheck.gate.junit import junit_tree, xml_text
from flakecheck.gate.markdown import gate_markdown
from flakecheck.reports.facts import clean
from flakecheck.reports.finished import write_report_html
from flakecheck.reports.html import render_html
from flakecheck.reports.json_report import render_json
from flakecheck.reports.markdown import render_markdown
from flakecheck.reports.terminal import render_summary, summary_line
from tests.run_builder import SCRIPT, CaseSpec, RunSpec, run_specs, write_run

PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class _HtmlFacts(HTMLParser):
    """What a browser would see: the case rows' ids and every <script> element's text."""

    def __init__(self) -> None:
        super().__init__()
        self.row_ids: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "tr" and "data-id" in values:
            self.row_ids.append(values["data-id"] or "")
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def _statuses(run: RunData) -> dict[str, int]:
    return {s: int((run.cases.status == s).sum()) for s in STATUSES}


def _empty_reference_answers(run: RunData) -> set[str]:
    ref = run.runs[run.runs.composition == run.meta["reference"]]
    return {str(c) for c, t in zip(ref.case_id, ref.text) if not (t or "").strip()}


def check_every_format(run: RunData) -> None:
    ids = sorted(str(c) for c in run.cases.case_id)
    counts = _statuses(run)

    # terminal: renders, states every status count
    out = io.StringIO()
    render_summary(run, Console(file=out, width=100, color_system=None))
    text = out.getvalue()
    assert all(f"{s}" in text for s in STATUSES)
    assert ("score swing" in text) == bool(run.runs.passed.notna().any())
    line = summary_line(run)
    assert all(f"{counts[s]} {s}" in line for s in STATUSES) and "\n" not in line

    # markdown: the status table matches cases.parquet, no raw markup from suite or model text
    md = render_markdown(run, top=100)
    assert all(f"| {s} | {counts[s]} |" in md for s in STATUSES)
    assert "<script" not in md and "<b>" not in md

    # json: parses without NaN; its counts are the table's
    report = json.loads(render_json(run, top=100), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert report["counts"] == counts and report["n_cases"] == len(ids)
    assert sorted(report["verdict_flips"]) == sorted(str(c) for c in run.cases[run.cases.verdict_flip].case_id)
    assert {c["case_id"] for c in report["top"]} == {str(c) for c in run.cases[run.cases.status != "stable"].case_id}
    assert set(report["empty_answers"]["case_ids"]) == _empty_reference_answers(run)

    # flips and score swing: the json states what the tables hold
    kinds = run.cases.flip_kind.dropna()
    assert report["flips"]["counts"] == {k: int((kinds == k).sum()) for k in FLIP_KINDS}
    assert (run.cases.flip_kind.isna() == run.cases.gap_at_divergence.isna()).all()
    graded = run.runs.dropna(subset=["passed"]).groupby("case_id").passed
    worst, best = (graded.all().mean(), graded.any().mean()) if len(graded) else (None, None)
    score = report["score"]
    assert score["n_graded"] == len(graded) and score["worst_case"] == worst and score["best_case"] == best
    swings = bool(score["swing_pp"])

    # html: one row per case, and the only <script> elements are the report's own two (data + code)
    page = render_html(run)
    parsed = _HtmlFacts()
    parsed.feed(page)
    parsed.close()
    assert sorted(parsed.row_ids) == ids
    assert len(parsed.scripts) == 2 and not any("alert(1)" in s for s in parsed.scripts[1:])
    assert SCRIPT not in page
    assert ('id="score-swing"' in page) == bool(score["n_graded"])
    assert ("from batch composition alone" in page) == swings
    json.loads(parsed.scripts[0])  # the data blob stays valid JSON

    # junit and the gate's markdown: every case is a testcase; nothing unescaped
    result = evaluate(run, None, [], None, None, False, date(2026, 12, 1))
    xml = ET.tostring(junit_tree(result).getroot(), encoding="unicode")
    root = ET.fromstring(xml)
    names = sorted(tc.get("name") or "" for tc in root.iter("testcase"))
    assert names == sorted(xml_text(i) for i in ids)
    assert int(root.get("failures") or -1) == sum(1 for _ in root.iter("failure"))
    gate_md = gate_markdown(result)
    assert "<script" not in gate_md and ("passed" in gate_md or "failed" in gate_md)
    suite_props = {p.get("name") for p in root.find("testsuite").find("properties")}
    assert ("score_swing_pp" in suite_props) == bool(score["n_graded"])
    assert ("from batch composition alone" in gate_md) == swings and ("Score swing" in md) == bool(score["n_graded"])


@PROPERTY_SETTINGS
@given(spec=run_specs())
def test_every_report_format_renders_any_run_directory(spec: RunSpec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp), spec)
        assert len(run.cases) == len(spec.cases)
        check_every_format(run)
        assert write_report_html(run, Path(tmp) / "report.html") is None


def _one_token_run(tmp_path: Path) -> RunData:
    """Issue 11's crash: diverged cases whose outputs are a single token (an end-of-turn, decoding to '')."""
    cases = [CaseSpec("one", "a", [[0], [3]], [0.0]), CaseSpec("empty-ref", None, [[], [3]], []),
             CaseSpec("same", None, [[4], [4]], [0.5])]
    return write_run(tmp_path, RunSpec(["solo", "batch8"], cases))


def test_one_token_outputs_render_in_every_format(tmp_path: Path) -> None:
    run = _one_token_run(tmp_path)
    assert set(run.cases[run.cases.status.isin(["flaky", "verdict_flaky"])].case_id) == {"one", "empty-ref"}
    check_every_format(run)


def test_clean_keeps_list_cells_lists_and_makes_numpy_scalars_python() -> None:
    assert clean(np.array([7], dtype=np.int32)) == [7] and clean(np.array([], dtype=np.int32)) == []
    assert clean(np.array([1, 2], dtype=np.int32)) == [1, 2]
    assert type(clean(np.int32(5))) is int and type(clean(np.float32(0.5))) is float
    assert type(clean(np.bool_(True))) is bool and clean(np.float32("nan")) is None and clean(None) is None
    assert clean(np.array([np.nan])) == [None] and clean("text") == "text"


def test_empty_answers_warn_in_every_report(tmp_path: Path) -> None:
    """2 of 3 empty reference answers: far above the 10% rule, so every report says so."""
    run = _one_token_run(tmp_path)
    warning = "2 of 3 cases produced an empty answer"
    out = io.StringIO()
    render_summary(run, Console(file=out, width=200, color_system=None))
    assert warning in out.getvalue()
    assert warning in render_markdown(run) and warning in render_html(run)
    assert json.loads(render_json(run))["empty_answers"]["warning"].startswith(warning)


def test_no_empty_answer_warning_below_a_tenth(tmp_path: Path) -> None:
    cases = [CaseSpec(f"c{i}", None, [[0] if i == 0 else [3, 4]], [1.0]) for i in range(11)]
    run = write_run(tmp_path, RunSpec(["solo"], cases))
    assert json.loads(render_json(run))["empty_answers"] == {"count": 1, "case_ids": ["c0"], "warning": None}
