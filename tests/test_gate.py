"""`flakecheck gate`: exit codes over pass, fail, baseline and quarantine fixtures; JUnit; markdown."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flakecheck import cli
from flakecheck.data.rundir import RunData
from flakecheck.errors import UserError
from flakecheck.gate.gate import gate_command
from tests.fixtures_runs import *  # noqa: F403

DIVERGED = ["flaky", "verdict_flaky"]


def gate(run: RunData | Path, **options) -> int:
    args = dict(baseline=None, max_flaky_rate=None, max_verdict_flips=None, fail_on_new_fragile=False,
                quarantine=None, junit=None, markdown=None)
    args.update(options)
    for key in ("baseline",):
        if isinstance(args[key], RunData):
            args[key] = args[key].path
    return gate_command(run.path if isinstance(run, RunData) else run, **args)


def quarantine_file(path: Path, entries: list[dict]) -> Path:
    path.write_text("# known flaky cases\n\n" + "\n".join(json.dumps(e) for e in entries) + "\n")
    return path


def diverged_ids(run: RunData) -> list[str]:
    return list(run.cases[run.cases.status.isin(DIVERGED)].case_id)


def needs_divergence(run: RunData) -> None:
    if not diverged_ids(run):
        pytest.skip("the split-K run of the tiny model gave no divergent case this time")


def test_a_run_with_nothing_flaky_passes_with_the_defaults(tight_invariant_run) -> None:
    assert not diverged_ids(tight_invariant_run)
    assert gate(tight_invariant_run) == 0


def test_flaky_cases_fail_the_strict_defaults_and_pass_generous_budgets(splitk_report_run) -> None:
    needs_divergence(splitk_report_run)
    cases = splitk_report_run.cases
    rate = len(diverged_ids(splitk_report_run)) / len(cases)
    flips = int(cases.verdict_flip.sum())
    assert gate(splitk_report_run) == 1
    assert gate(splitk_report_run, max_flaky_rate=rate, max_verdict_flips=flips) == 0
    assert gate(splitk_report_run, max_flaky_rate=rate * 0.99, max_verdict_flips=flips) == 1
    if flips:
        assert gate(splitk_report_run, max_flaky_rate=1.0, max_verdict_flips=flips - 1) == 1


def test_against_a_baseline_a_newly_divergent_case_fails(splitk_report_run, tight_invariant_run, tmp_path) -> None:
    assert gate(tight_invariant_run, baseline=splitk_report_run) == 0  # fewer flakes than the baseline: fine
    assert gate(splitk_report_run, baseline=splitk_report_run) == 0  # no worse than itself
    needs_divergence(splitk_report_run)
    assert gate(splitk_report_run, baseline=tight_invariant_run, max_flaky_rate=1.0, max_verdict_flips=10**6,
                junit=tmp_path / "j.xml") == 1
    failed = {tc.get("name") for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
              if tc.find("failure") is not None}
    assert failed == set(diverged_ids(splitk_report_run))


def test_newly_fragile_fails_only_when_asked(loose_invariant_run, tight_invariant_run) -> None:
    before = dict(zip(tight_invariant_run.cases.case_id, tight_invariant_run.cases.status))
    now = dict(zip(loose_invariant_run.cases.case_id, loose_invariant_run.cases.status))
    assert any(before[c] == "stable" and now[c] == "fragile" for c in now)
    assert gate(loose_invariant_run, baseline=tight_invariant_run) == 0
    assert gate(loose_invariant_run, baseline=tight_invariant_run, fail_on_new_fragile=True) == 1


def test_quarantined_cases_do_not_fail_but_an_expired_entry_does(splitk_report_run, tight_invariant_run,
                                                                 tmp_path) -> None:
    some_case = str(tight_invariant_run.cases.case_id.iloc[0])
    expired = quarantine_file(tmp_path / "expired.jsonl",
                              [{"id": some_case, "reason": "old news", "expires": "2000-01-01"}])
    assert gate(tight_invariant_run, quarantine=expired) == 1
    unknown_expired = quarantine_file(tmp_path / "gone.jsonl",
                                      [{"id": "not-a-case", "reason": "removed", "expires": "2000-01-01"}])
    assert gate(tight_invariant_run, quarantine=unknown_expired) == 1  # stale entries must be cleaned up
    needs_divergence(splitk_report_run)
    held = quarantine_file(tmp_path / "held.jsonl", [
        {"id": case_id, "reason": "near-tie, tracked", "expires": "2999-12-31"}
        for case_id in diverged_ids(splitk_report_run)
    ])
    assert gate(splitk_report_run) == 1
    assert gate(splitk_report_run, quarantine=held, junit=tmp_path / "q.xml") == 0
    skipped = {tc.get("name") for tc in ET.parse(tmp_path / "q.xml").getroot().iter("testcase")
               if tc.find("skipped") is not None}
    assert skipped == set(diverged_ids(splitk_report_run))


@pytest.mark.parametrize("line", [
    '{"id": "a", "reason": "x"}', '{"id": "a", "expires": "2030-01-01"}',
    '{"id": "a", "reason": "x", "expires": "soon"}',
    '["a"]', "{not json", '{"reason": "x", "expires": "2030-01-01"}',
])
def test_a_bad_quarantine_line_is_a_user_error_naming_the_line(tight_invariant_run, tmp_path, line: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "ok", "reason": "fine", "expires": "2030-01-01"}\n' + line + "\n")
    with pytest.raises(UserError, match=r"q\.jsonl:2"):
        gate(tight_invariant_run, quarantine=path)


def test_junit_has_one_testcase_per_case_with_outcomes_and_properties(loose_invariant_run, tight_invariant_run,
                                                                       splitk_report_run, tmp_path) -> None:
    held_id = str(loose_invariant_run.cases.case_id.iloc[-1])
    held = quarantine_file(tmp_path / "q.jsonl", [{"id": held_id, "reason": "known", "expires": "2999-01-01"}])
    assert gate(loose_invariant_run, baseline=tight_invariant_run, fail_on_new_fragile=True, quarantine=held,
                junit=tmp_path / "fragile.xml") == 1
    root = ET.parse(tmp_path / "fragile.xml").getroot()
    testcases = list(root.iter("testcase"))
    assert sorted(tc.get("name") for tc in testcases) == sorted(map(str, loose_invariant_run.cases.case_id))
    before = dict(zip(tight_invariant_run.cases.case_id, tight_invariant_run.cases.status))
    for tc in testcases:
        props = {p.get("name"): p.get("value") for p in tc.find("properties").iter("property")}
        assert {"status", "p_flip_pred", "min_gap"} <= set(props) and "risk" not in props
        newly_fragile = before[tc.get("name")] == "stable" and props["status"] == "fragile"
        if tc.get("name") == held_id:
            assert tc.find("skipped") is not None and tc.find("failure") is None
        else:
            assert (tc.find("failure") is not None) == newly_fragile
    suite = root.find("testsuite")
    assert int(suite.get("tests")) == len(testcases)
    assert int(suite.get("failures")) == sum(tc.find("failure") is not None for tc in testcases)

    needs_divergence(splitk_report_run)
    assert gate(splitk_report_run, max_flaky_rate=1.0, max_verdict_flips=10**6, junit=tmp_path / "flaky.xml") == 0
    for tc in ET.parse(tmp_path / "flaky.xml").getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.find("properties").iter("property")}
        assert (tc.find("flakyFailure") is not None) == (props["status"] in DIVERGED)
        assert tc.find("failure") is None
        if props["status"] in DIVERGED:
            assert "first_divergence" in props


def test_markdown_file_and_github_step_summary(splitk_report_run, tight_invariant_run, tmp_path, monkeypatch) -> None:
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code = gate(splitk_report_run, markdown=tmp_path / "gate.md")
    assert gate(tight_invariant_run) == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, never overwritten
    assert text.count("flakecheck gate") == 2 and len(text.encode()) < 1024 * 1024
    written = (tmp_path / "gate.md").read_text()
    assert ("passed" in written.splitlines()[0]) == (code == 0)
    assert written in text
    if code == 1:
        assert "<details>" in written and "</details>" in written
    assert "<script" not in text


def test_bad_arguments_are_user_errors(tight_invariant_run, tmp_path) -> None:
    for options in (dict(max_flaky_rate=1.5), dict(max_flaky_rate=-0.1), dict(max_verdict_flips=-1),
                    dict(fail_on_new_fragile=True), dict(baseline=tmp_path / "nope"),
                    dict(quarantine=tmp_path / "missing.jsonl")):
        with pytest.raises(UserError):
            gate(tight_invariant_run, **options)
    with pytest.raises(UserError):
        gate(tmp_path / "not-a-run")


def cli_gate(monkeypatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["flakecheck", "gate", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
        raise SystemExit(0)
    return exit_info.value.code


def test_cli_exit_codes_on_a_copied_run_directory(tight_invariant_run, tmp_path, monkeypatch) -> None:
    copy = Path(shutil.copytree(tight_invariant_run.path, tmp_path / "copy"))
    assert cli_gate(monkeypatch, str(copy)) == 0
    expired = quarantine_file(tmp_path / "q.jsonl", [{"id": "x", "reason": "old", "expires": "2001-01-01"}])
    assert cli_gate(monkeypatch, str(copy), "--quarantine", str(expired)) == 1
    (copy / "runs.parquet").write_bytes(b"not parquet")
    assert cli_gate(monkeypatch, str(copy)) == 2
    assert cli_gate(monkeypatch, str(tmp_path / "nowhere")) == 2


# ------------------------------------------------------------------------------------------- --max-score-swing


def _swing_run(tmp_path: Path) -> RunData:
    """4 graded cases; one passes under solo only ('a' vs ' the'), so worst 1/4, best 2/4: a 25 pp swing."""
    from tests.run_builder import CaseSpec, RunSpec, write_run

    cases = [CaseSpec("flips", "a", [[3], [4]], [1.0]), CaseSpec("passes", "a", [[3], [3]], [1.0]),
             CaseSpec("fails", "a", [[4], [4]], [1.0]), CaseSpec("also-fails", "a", [[5], [5]], [1.0]),
             CaseSpec("ungraded", None, [[3], [4]], [1.0])]
    return write_run(tmp_path, RunSpec(["solo", "batch8"], cases))


def test_max_score_swing_fails_a_run_whose_swing_exceeds_it(tmp_path: Path, capsys) -> None:
    run = _swing_run(tmp_path / "run")
    lenient = dict(max_flaky_rate=1.0, max_verdict_flips=10)
    junit = tmp_path / "gate.xml"
    assert gate(run, **lenient, max_score_swing=20, junit=junit, markdown=tmp_path / "gate.md") == 1
    out = capsys.readouterr().out
    assert "score swing 25.0 pp exceeds the maximum 20 pp" in " ".join(out.split())
    assert "score swing 25.0 pp (max 20 pp)" in (tmp_path / "gate.md").read_text()
    root = ET.parse(junit).getroot()
    props = {p.get("name"): p.get("value") for p in root.find("testsuite").find("properties")}
    assert (props["score_worst_case"], props["score_best_case"], props["score_swing_pp"]) == (
        "0.250000", "0.500000", "25.000")
    failed = {tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None}
    assert failed == {"flips"}
    assert gate(run, **lenient, max_score_swing=25) == 0  # at the limit is within it
    assert gate(run, **lenient) == 0  # not gated unless asked


def test_max_score_swing_leaves_quarantined_cases_out(tmp_path: Path) -> None:
    run = _swing_run(tmp_path / "run")
    held = quarantine_file(tmp_path / "q.jsonl", [{"id": "flips", "reason": "known", "expires": "2099-01-01"}])
    assert gate(run, max_flaky_rate=1.0, max_verdict_flips=10, max_score_swing=0, quarantine=held) == 0


def test_max_score_swing_must_be_percentage_points(tmp_path: Path) -> None:
    run = _swing_run(tmp_path / "run")
    with pytest.raises(UserError, match="percentage points"):
        gate(run, max_score_swing=150)
