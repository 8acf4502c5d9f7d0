"""`flakecheck import promptfoo` and `gate --min-pass-rate` on real promptfoo output: tests/fixtures/promptfoo holds
two results files that promptfoo 0.121.20 wrote (`eval --repeat 3` at --max-concurrency 1 and 8 against
`flakecheck serve --kernels splitk --record-responses`, the tiny wide model; five of its thirteen tests kept,
HTTP headers dropped) and the record lines of those five tests' prompts.

Every expected value is recomputed from the promptfoo files and the record themselves."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from flakecheck import cli
from flakecheck.data.promptfoo_config import chat_messages
from flakecheck.serve.response_record import prompt_sha256
from tests.harness_helpers import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "promptfoo"
C1, C8, RECORD = FIXTURES / "c1.json", FIXTURES / "c8.json", FIXTURES / "record.jsonl"


def rows_by_case() -> dict[str, list[tuple[str, int, int, bool]]]:
    """case id (the test's description: one prompt) -> (output, concurrency, repeat, passed) per result."""
    by_case: dict[str, list[tuple[str, int, int, bool]]] = defaultdict(list)
    for path in (C1, C8):
        data = json.loads(path.read_text())
        repeat = data["runtimeOptions"]["repeat"]
        for row in data["results"]["results"]:
            by_case[row["testCase"]["description"]].append(
                (row["response"]["output"], data["runtimeOptions"]["maxConcurrency"], row["testIdx"] % repeat,
                 row["success"]))
    return by_case


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pf") / "run"
    old = sys.argv
    sys.argv = ["flakecheck", "import", "promptfoo", str(C1), str(C8), "--record", str(RECORD), "--out", str(out),
                "--suite", str(out.parent / "suite.jsonl"), "--no-html", "--quiet"]
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
    finally:
        sys.argv = old
    assert (exit_info.value.code or 0) == 0
    return out


def test_the_verdicts_are_promptfoos_and_a_case_is_flaky_exactly_when_its_answers_differ(imported: Path) -> None:
    cases = pd.read_parquet(imported / "cases.parquet").set_index("case_id")
    runs = pd.read_parquet(imported / "runs.parquet")
    by_case = rows_by_case()
    assert sorted(cases.index) == sorted(by_case)
    assert any(len({r[0] for r in rows}) > 1 for rows in by_case.values())  # the fixture does hold a flip
    for case_id, rows in by_case.items():
        assert (cases.loc[case_id, "status"] in ("flaky", "verdict_flaky")) == (len({r[0] for r in rows}) > 1)
        for output, concurrency, repeat, passed in rows:
            [row] = runs[(runs.case_id == case_id) & (runs.composition == f"c{concurrency}")
                         & (runs.repeat == repeat)].itertuples()
            assert row.passed == passed and row.text == output


def test_the_record_gives_every_case_its_tokens_and_the_divergence_gap(imported: Path) -> None:
    meta = json.loads((imported / "meta.json").read_text())
    assert meta["import"]["divergence_by"] == {"token": 5, "text": 0}
    cases = pd.read_parquet(imported / "cases.parquet").set_index("case_id")
    record = [json.loads(line) for line in RECORD.read_text().splitlines()]
    for case_id in cases.index[cases.first_divergence.notna()]:
        data = json.loads(C1.read_text())
        raw = next(r["prompt"]["raw"] for r in data["results"]["results"] if r["testCase"]["description"] == case_id)
        key = prompt_sha256(chat_messages(raw) or [{"role": "user", "content": raw}])
        token_lists = [[t["id"] for t in line["tokens"]] for line in record if line["prompt_sha256"] == key]
        step = int(cases.loc[case_id, "first_divergence"])
        assert all(t[:step] == token_lists[0][:step] for t in token_lists)
        assert any(len(t) <= step or t[step] != token_lists[0][step] for t in token_lists)
        assert cases.loc[case_id, "flip_kind"] in ("tie", "near_tie", "confident")


def test_without_the_record_only_text_divergences_are_known(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "import", "promptfoo", C1, C8, "--out", tmp_path / "run", "--no-html")
    assert code == 0
    assert "only text divergences are known" in " ".join(err.split())
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["import"]["divergence_by"] == {"token": 0, "text": 5}
    cases = pd.read_parquet(tmp_path / "run" / "cases.parquet")
    assert cases.flip_kind.isna().all()


def test_the_suite_replays_promptfoos_requests_and_leaves_the_javascript_case_ungraded(imported: Path) -> None:
    from flakecheck.data.suite import load_suite

    suite = load_suite(imported.parent / "suite.jsonl")
    data = json.loads(C1.read_text())
    sent = {r["testCase"]["description"]: r["prompt"]["raw"] for r in data["results"]["results"]}
    for case in suite.cases:
        assert case.input == [{"role": "user", "content": sent[case.id]}]
        assert case.max_tokens == data["config"]["providers"][0]["config"]["max_tokens"]
        if case.id == "judged by code":
            assert not case.checks and "javascript" in case.metadata["ungraded"]
        else:
            assert [c.type for c in case.checks] == ["icontains"]


@pytest.mark.parametrize("edit, field", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: text.replace('"version":3', '"version":4', 1), "results.version"),
    (lambda text: text.replace("Tell me about", "Tell us about"), "results.results"),
])
def test_a_bad_results_file_is_refused_naming_the_file_and_field(tmp_path: Path, capsys, edit, field) -> None:
    bad = tmp_path / "c8.json"
    bad.write_text(edit(C8.read_text()))
    code, _, err = run_cli(capsys, "import", "promptfoo", C1, bad, "--out", tmp_path / "run")
    assert code == 2 and str(bad) in err and field in err
    assert not (tmp_path / "run").exists()


def test_gate_min_pass_rate_fails_exactly_the_cases_below_it(imported: Path, tmp_path: Path, capsys) -> None:
    by_case = rows_by_case()
    for limit in (1.0, 0.5):
        junit = tmp_path / f"junit-{limit}.xml"
        markdown = tmp_path / f"gate-{limit}.md"
        code, out, _ = run_cli(capsys, "gate", imported, "--max-flaky-rate", "1", "--max-verdict-flips", "99",
                               "--min-pass-rate", str(limit), "--junit", junit, "--markdown", markdown)
        below = {c for c, rows in by_case.items() if sum(r[3] for r in rows) < limit * len(rows)}
        assert code == (1 if below else 0)
        root = ET.parse(junit).getroot()
        assert {tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None} == below
        for tc in root.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in tc.iter("property")}
            rows = by_case[tc.get("name")]
            assert int(props["runs_passed"]) == sum(r[3] for r in rows) and int(props["runs_graded"]) == len(rows)
            assert props["pass_k"] == str(all(r[3] for r in rows)).lower()
        text = markdown.read_text()
        every = sum(all(r[3] for r in rows) for rows in by_case.values())
        assert f"pass^k over 6 runs per case: {every} of {len(by_case)} graded cases passed every run" in text


def test_gate_min_pass_rate_out_of_range_is_bad_input(imported: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "gate", imported, "--min-pass-rate", "1.5")
    assert code == 2 and "--min-pass-rate" in err


def test_one_results_file_compares_its_repeats(tmp_path: Path, capsys) -> None:
    copy = tmp_path / "only.json"
    shutil.copy(C8, copy)
    code, _, err = run_cli(capsys, "import", "promptfoo", copy, "--record", RECORD, "--out", tmp_path / "run",
                           "--no-html")
    assert code == 0, err
    runs = pd.read_parquet(tmp_path / "run" / "runs.parquet")
    assert sorted(runs.groupby("case_id").size().unique()) == [3]
