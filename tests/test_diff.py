"""`flakecheck diff`: a constructed pair of suites with planted regressions, an improvement, noise and changed
text, built as run directories without the model (tests/run_builder.py), checked against what was planted; the
score change and its interval against an independent count; the gate, the pairing and every report format."""

from __future__ import annotations

import itertools
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import escape

from flakecheck import cli
from flakecheck.data.rundir import RunData
from flakecheck.diff.classify import classify
from flakecheck.diff.compare import diff_runs
from flakecheck.diff.html import render_diff_html
from flakecheck.diff.json_report import diff_dict
from flakecheck.diff.junit import diff_junit_tree
from flakecheck.diff.markdown import diff_markdown
from flakecheck.diff.score import change_sentence
from tests.run_builder import SCRIPT, VOCAB, CaseSpec, RunSpec, write_run

COMPOSITIONS = ["solo", "batch8", "load"]
CHECK = "42"  # a case passes when its answer contains the token "42"
P, P2, F, F2 = [3, 13], [13], [3, 4], [4, 3]  # token ids: two passing answers, two failing ones
TEXT = [13, 8]  # passes, with <script> in it
assert VOCAB[13] == CHECK and VOCAB[8] == SCRIPT

# case id -> (A's answers per composition, B's answers per composition, the class planted)
PLANTED = {
    "reg-1": ([P, P, P], [F, F, F], "regression"),
    "reg-2": ([P, P2, P], [F, F2, F], "regression"),
    "imp-1": ([F, F, F], [P, P, P], "improvement"),
    "noise-a": ([P, P, F], [F, F, P], "noise"),  # the one-run diff reads pass -> fail
    "noise-b": ([P, P, P], [F, P, P], "noise"),  # stable on A, flaky on B: pass -> fail in the one-run diff
    "noise-c": ([F, P, F], [F, F, F], "noise"),  # flaky on A only; the one-run diff sees no change
    "same-1": ([P, P, P], [P, P, P], "same"),
    "same-2": ([P, P2, P], [P2, P2, P2], "same"),  # an answer of B is one A gave
    "text-1": ([P, P, P], [TEXT, TEXT, TEXT], "changed-text"),
}
UNGRADED = {"free": ([[3], [3], [3]], [[4], [4], [4]], "changed-text")}


def passes(ids: list[int]) -> bool:
    return CHECK in "".join(VOCAB[i] for i in ids)


def build(path: Path, side: int, planted: dict = PLANTED, prefix: str = "") -> RunData:
    cases = [CaseSpec(prefix + case_id, CHECK, outputs[side], [1.0] * 8) for case_id, outputs in planted.items()]
    cases += [CaseSpec(prefix + case_id, None, outputs[side], [1.0] * 8) for case_id, outputs in UNGRADED.items()]
    return write_run(path, RunSpec(COMPOSITIONS, cases))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunData, RunData]:
    root = tmp_path_factory.mktemp("diff")
    return build(root / "a", 0), build(root / "b", 1)


@pytest.fixture(scope="module")
def noise_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunData, RunData]:
    """B's answers are A's under another composition (the compositions reversed): every difference is noise."""
    root = tmp_path_factory.mktemp("noise")
    shuffled = {case_id: (a, a[::-1], "") for case_id, (a, _b, _k) in PLANTED.items()}
    return build(root / "a", 0, shuffled), build(root / "b", 1, shuffled)


def cli_diff(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["flakecheck", "diff", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


def test_every_planted_class_is_found(pair) -> None:
    result = diff_runs(*pair)
    found = {c.case_id: c.kind for c in result.cases}
    assert found == {case_id: kind for case_id, (_a, _b, kind) in {**PLANTED, **UNGRADED}.items()}
    assert result.pairing.by == "id" and not result.notes


def test_the_one_run_diff_changes_are_regressions_improvements_or_noise(pair) -> None:
    result = diff_runs(*pair)
    changed = {c.case_id for c in result.raw_changed}
    # the reference is the first composition: a one-run diff compares answers[0] of each side
    expected = {i for i, (a, b, _k) in PLANTED.items() if passes(a[0]) != passes(b[0])}
    assert changed == expected
    assert result.raw_counts == {"regression": 2, "improvement": 1, "noise": 2}


def test_each_reason_gives_the_pass_rates(pair) -> None:
    by_id = {c.case_id: c for c in diff_runs(*pair).cases}
    assert (by_id["noise-b"].passed_a, by_id["noise-b"].graded_a, by_id["noise-b"].passed_b) == (3, 3, 2)
    assert "A passes under 3 of 3 compositions, B under 2 of 3" in by_id["noise-b"].why
    assert "B's own compositions" in by_id["noise-b"].why
    assert by_id["free"].graded_a == 0 and "no verdict" in by_id["free"].why
    assert [by_id[i].flaky_on for i in ("noise-a", "noise-b", "noise-c", "reg-1")] == ["both", "B", "A", ""]


def test_score_change_and_interval_against_an_independent_count(pair) -> None:
    score = diff_runs(*pair).score
    per_a = [sum(passes(a[i]) for a, _b, _k in PLANTED.values()) / len(PLANTED) for i in range(3)]
    per_b = [sum(passes(b[i]) for _a, b, _k in PLANTED.values()) / len(PLANTED) for i in range(3)]
    pairings = [100 * (sb - sa) for sa, sb in itertools.product(per_a, per_b)]
    assert score.n_graded == len(PLANTED)
    assert score.change_pp == pytest.approx(100 * (sum(per_b) - sum(per_a)) / 3)
    assert (score.low_pp, score.high_pp) == (pytest.approx(min(pairings)), pytest.approx(max(pairings)))
    assert score.low_pp <= score.raw_pp <= score.high_pp  # the one-run diff is one of the pairings
    assert score.noise_pp >= max(abs(p - score.change_pp) for p in pairings) - 1e-9
    assert score.beyond_noise_pp == pytest.approx(100 * (1 - 2) / len(PLANTED))
    low, high = score.mixed_pp
    assert low <= score.low_pp and high >= score.high_pp  # a mix of compositions can reach further


def test_the_gate_fails_on_a_planted_regression_and_passes_on_noise_alone(pair, noise_pair, monkeypatch,
                                                                         capsys) -> None:
    code, out, _ = cli_diff(monkeypatch, capsys, str(pair[0].path), str(pair[1].path))
    assert code == 1 and "2 regression(s) beyond batch noise" in out and "reg-1" in out
    result = diff_runs(*noise_pair)
    assert result.counts["regression"] == result.counts["improvement"] == 0
    assert result.raw_changed and {c.kind for c in result.raw_changed} == {"noise"}
    code, out, _ = cli_diff(monkeypatch, capsys, str(noise_pair[0].path), str(noise_pair[1].path))
    assert code == 0 and "diff gate PASSED" in out
    assert cli_diff(monkeypatch, capsys, str(pair[0].path), str(pair[1].path), "--max-regressions", "2")[0] == 0


def test_a_score_drop_under_every_pairing_fails_without_a_regression(tmp_path, monkeypatch, capsys) -> None:
    """Each case fails under one composition of B only: no case regresses, but every pairing drops."""
    planted = {f"c{i}": ([P, P, P], [F if j == i else P for j in range(3)], "noise") for i in range(3)}
    a, b = build(tmp_path / "a", 0, planted), build(tmp_path / "b", 1, planted)
    result = diff_runs(a, b)
    assert result.counts["regression"] == 0 and result.score.high_pp < 0
    code, out, _ = cli_diff(monkeypatch, capsys, str(a.path), str(b.path))
    assert code == 1 and "drops by more than 0 pp under every pairing" in out
    assert cli_diff(monkeypatch, capsys, str(a.path), str(b.path), "--max-score-drop", "40")[0] == 0


def test_cases_pair_by_position_when_ids_differ(pair, tmp_path) -> None:
    renamed = build(tmp_path / "b", 1, prefix="new-")
    result = diff_runs(pair[0], renamed)
    assert result.pairing.by == "position" and "paired by position" in result.notes[0]
    assert [c.kind for c in result.cases] == [c.kind for c in diff_runs(*pair).cases]
    assert result.cases[0].label == "reg-1 ↔ new-reg-1"


def test_mismatched_cases_and_arguments_are_exit_2(pair, tmp_path, monkeypatch, capsys) -> None:
    fewer = build(tmp_path / "fewer", 1, {k: v for k, v in PLANTED.items() if k != "imp-1"}, prefix="x-")
    code, _, err = cli_diff(monkeypatch, capsys, str(pair[0].path), str(fewer.path))
    assert code == 2 and str(pair[0].path) in err and str(fewer.path) in err
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"id": "a", "input": "x"}\n')
    code, _, err = cli_diff(monkeypatch, capsys, str(pair[0].path), str(suite))
    assert code == 2 and "two run directories or two suite files" in err
    code, _, err = cli_diff(monkeypatch, capsys, str(pair[0].path), str(pair[1].path), "--limit", "3")
    assert code == 2 and "limit" in err
    code, _, err = cli_diff(monkeypatch, capsys, str(pair[0].path), str(tmp_path / "missing"))
    assert code == 2


def test_suites_that_cannot_pair_are_refused_before_any_replay(tmp_path, monkeypatch, capsys) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "x", "input": "1"}\n{"id": "y", "input": "2"}\n')
    b.write_text('{"id": "z", "input": "1"}\n')
    code, _, err = cli_diff(monkeypatch, capsys, str(a), str(b), "--out", str(tmp_path / "out"))
    assert code == 2 and str(a) in err and str(b) in err
    assert not (tmp_path / "out").exists()


def test_every_format_carries_the_score_change_and_the_classes(pair, tmp_path, monkeypatch, capsys) -> None:
    result = diff_runs(*pair)
    sentence = change_sentence(result.score)
    assert f"±{result.score.noise_pp:.1f} pp" in sentence
    data = diff_dict(result)
    assert data["score"]["sentence"] == sentence and data["score"]["interval_pp"] == [result.score.low_pp,
                                                                                      result.score.high_pp]
    assert json.loads(json.dumps(data)) == data
    page = render_diff_html(result)
    assert str(escape(sentence)) in page and SCRIPT not in page and "&lt;script&gt;" in page
    assert "Content-Security-Policy" in page and "<script" not in page
    assert sentence in diff_markdown(result).replace("\\", "") and SCRIPT not in diff_markdown(result)
    code, out, _ = cli_diff(monkeypatch, capsys, str(pair[0].path), str(pair[1].path), "--json",
                            "--junit", str(tmp_path / "d.xml"), "--markdown", str(tmp_path / "d.md"),
                            "--html", str(tmp_path / "d.html"))
    assert code == 1 and json.loads(out)["counts"]["regression"] == 2
    assert (tmp_path / "d.md").read_text().startswith("### flakecheck diff ❌ failed")
    assert (tmp_path / "d.html").read_text() == page
    code, out, _ = cli_diff(monkeypatch, capsys, str(pair[0].path), str(pair[1].path))
    assert sentence in out


def test_junit_fails_regressions_and_marks_noise_flaky(pair) -> None:
    root = diff_junit_tree(diff_runs(*pair)).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert {n for n, c in cases.items() if c.find("failure") is not None} == {"reg-1", "reg-2"}
    assert {n for n, c in cases.items() if c.find("flakyFailure") is not None} == {"noise-a", "noise-b", "noise-c"}
    assert root.get("failures") == "2"
    ET.tostring(root)  # serialisable


verdict_lists = st.lists(st.sampled_from([True, False]), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(verdict_lists, verdict_lists)
def test_noise_is_exactly_where_the_pairings_disagree(va: list[bool], vb: list[bool]) -> None:
    """Stated over the pairings, not over each side: a case is noise when some pairing of compositions shows a
    changed verdict and another shows none; regression / improvement when every pairing shows the same change."""
    case = classify("c", "c", {f"a{i}": v for i, v in enumerate(va)}, {f"b{i}": v for i, v in enumerate(vb)},
                    {"a0": "x"}, {"b0": "x"}, "a0", "b0")
    outcomes = {(x, y) for x in va for y in vb}
    changed = {x != y for x, y in outcomes}
    if changed == {True, False}:
        assert case.kind == "noise"
    elif outcomes == {(True, False)}:
        assert case.kind == "regression"
    elif outcomes == {(False, True)}:
        assert case.kind == "improvement"
    else:
        assert changed == {False} and case.kind == "same"


def suite_lines(cases: list[tuple[str, str, dict]]) -> str:
    return "".join(json.dumps({"id": i, "input": [{"role": "user", "content": prompt}], "checks": [check]}) + "\n"
                   for i, prompt, check in cases)


@pytest.mark.slow
def test_diff_runs_two_suites_on_the_default_model(tmp_path, monkeypatch, capsys) -> None:
    """The one-command path end to end: a check edited so that it can never pass is a regression whatever the
    model answers; an unchanged case is not; both runs, diff.json and diff.html land in --out."""
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    capital = "What is the capital of France?"
    before.write_text(suite_lines([("kept", capital, {"type": "icontains", "value": "paris"}),
                                   ("broken", "Name a colour.", {"type": "not-icontains", "value": "zqzqz"}),
                                   ("edited", "Say hello.", {"type": "icontains", "value": "hello"})]))
    after.write_text(suite_lines([("kept", capital, {"type": "icontains", "value": "paris"}),
                                  ("broken", "Name a colour.", {"type": "icontains", "value": "zqzqz"}),
                                  ("edited", "Say hello to the world, politely.",
                                   {"type": "icontains", "value": "hello"})]))
    out = tmp_path / "out"
    code, stdout, _ = cli_diff(monkeypatch, capsys, str(before), str(after), "--out", str(out), "--max-tokens", "8",
                               "--composition", "name=solo", "--composition", "name=batch4,max_batch=4",
                               "--quiet", "--json", "--no-html")
    data = json.loads(stdout)
    kinds = {c["case_id"]: c["class"] for c in data["cases"]}
    assert code == 1 and kinds["broken"] == "regression" and kinds["kept"] != "regression"
    assert set(kinds) == {"kept", "broken", "edited"} and data["score"]["change_pp"] is not None
    assert data["a"]["compositions"] == data["b"]["compositions"] == ["solo", "batch4"]
    assert json.loads((out / "diff.json").read_text()) == data and (out / "diff.html").is_file()
    assert (out / "a" / "meta.json").is_file() and (out / "b" / "meta.json").is_file()


def test_sides_under_other_compositions_are_compared_and_noted(tmp_path) -> None:
    a = build(tmp_path / "a", 0)
    solo_b = [CaseSpec(i, CHECK if i in PLANTED else None, [outputs[1][0]], [1.0] * 8)
              for i, outputs in {**PLANTED, **UNGRADED}.items()]
    b = write_run(tmp_path / "b", RunSpec(["solo"], solo_b))
    result = diff_runs(a, b)
    assert any("one composition only" in n for n in result.notes)
    assert any("different compositions" in n for n in result.notes)
    # B has no spread of its own: a case is noise only where A's compositions disagree
    by_id = {c.case_id: c for c in result.cases}
    assert by_id["noise-b"].kind == "regression"  # A passes under all 3, B fails under its only one
    assert all(c.kind != "noise" or len({passes(x) for x in PLANTED[c.case_id][0]}) > 1 for c in result.cases)
