"""`flakecheck import` on real harness output kept as fixtures (no harness needed): two inspect_ai .eval logs
(SmolLM2 behind `flakecheck serve --kernels splitk`, 1 and 16 connections, top-2 logprobs; zstd members read
without inspect_ai) checked against what inspect_ai's own reader saw in them (quick-*.oracle.json, written by
inspect_oracle.py), and two lm-eval samples files (num_concurrent 1 and 16, no logprobs). Also: files that
are not logs, samples missing or errored in one log, and the scorer mapping table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flakecheck.data.rundir import load_run
from flakecheck.data.suite import load_suite
from flakecheck.grading.checks import grade, parse_check
from flakecheck.harness.lmeval_samples import read_lmeval_samples
from flakecheck.harness.model import HarnessLog, ScorerSpec
from flakecheck.harness.scorers import map_scorer
from tests.harness_helpers import diverged, fixture, parting, reported, run_cli

INSPECT_LOGS = [fixture("quick-c1.eval"), fixture("quick-c16.eval")]
LMEVAL_FILES = [next(fixture(d).glob("samples_*.jsonl")) for d in ("lmeval-c1", "lmeval-c16")]


def oracle(name: str) -> dict[tuple[str, int], dict]:
    data = json.loads(fixture(name).read_text())
    return {(s["id"], s["epoch"]): s for s in data["samples"]}


def lmeval_lines(path: Path) -> dict[str, dict]:
    return {str(o["doc_id"]): o for o in map(json.loads, path.read_text().splitlines()) if o}


def test_inspect_logs_flag_exactly_the_samples_whose_tokens_differ_where_they_part(capsys, tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "import", "inspect", *INSPECT_LOGS, "--out", tmp_path / "run", "--suite",
                             tmp_path / "suite.jsonl", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    c1, c16 = oracle("quick-c1.oracle.json"), oracle("quick-c16.oracle.json")
    assert set(run.cases.case_id) == {sid for sid, _ in c1}
    assert run.meta["import"]["divergence_by"] == {"token": len(c1), "text": 0}
    for (sample_id, epoch), ref in c1.items():
        other = c16[(sample_id, epoch)]
        part = parting(ref["token_bytes"], other["token_bytes"])
        assert diverged(run.cases, sample_id) == (part is not None), sample_id
        assert reported(run.cases, sample_id, "first_divergence") == part
    for row in run.runs.itertuples():
        logged = (c1 if row.composition == "c1" else c16)[(row.case_id, row.repeat + 1)]
        assert row.text == logged["completion"]
        assert row.passed == (logged["scores"]["includes"] == "C")  # the harness's verdict, recorded
    assert run.meta["compositions"][0]["name"] == "c1" and run.meta["reference"] == "c1"


def test_a_mapped_scorer_grades_every_logged_answer_as_the_harness_did(capsys, tmp_path: Path) -> None:
    """The imported suite's checks, applied to the answers in the logs, give the harness's own verdicts."""
    for harness, logs, name in (("inspect", INSPECT_LOGS, "inspect.jsonl"), ("lm-eval", LMEVAL_FILES, "lm.jsonl")):
        code, _, err = run_cli(capsys, "import", harness, logs[0], "--suite", tmp_path / name)
        assert code == 0, err
        cases = {c.id: c for c in load_suite(tmp_path / name).cases}
        assert all(c.checks for c in cases.values())
        if harness == "inspect":
            answers = [(sid, s["completion"], s["scores"]["includes"] == "C")
                       for o in ("quick-c1.oracle.json", "quick-c16.oracle.json") for (sid, _), s in oracle(o).items()]
        else:
            answers = [(sid, o["resps"][0][0], o["exact_match"] == 1.0)
                       for f in LMEVAL_FILES for sid, o in lmeval_lines(f).items()]
        verdicts = [(sid, harness_passed, grade(text, cases[sid].checks, cases[sid].targets))
                    for sid, text, harness_passed in answers]
        assert any(v[1] for v in verdicts) and not all(v[1] for v in verdicts)  # both verdicts occur
        assert [v[1] for v in verdicts] == [v[2] for v in verdicts], verdicts


def test_the_suite_carries_the_request_lm_eval_sent(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "import", "lm-eval", LMEVAL_FILES[0], "--suite", tmp_path / "s.jsonl")
    assert code == 0, err
    lines = lmeval_lines(LMEVAL_FILES[0])
    for case in load_suite(tmp_path / "s.jsonl").cases:
        args = lines[case.id]["arguments"]["gen_args_0"]
        assert case.input == json.loads(args["arg_0"][0])
        assert case.max_tokens == args["arg_1"]["max_gen_toks"]
        assert list(case.stop) == args["arg_1"]["until"]
        assert case.metadata["task"] == "flk_quick" and case.metadata["sample_id"] == case.id


def test_lm_eval_runs_compare_by_text_and_say_so(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "import", "lm-eval", *LMEVAL_FILES, "--out", tmp_path / "run", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert run.meta["import"]["divergence_by"]["text"] == len(run.cases)
    assert "divergence by text" in run.meta["backend"]
    assert run.cases.risk.isna().all() and run.tokens.gap.isna().all()  # no logprobs: no near-tie claimed
    ref, other = lmeval_lines(LMEVAL_FILES[0]), lmeval_lines(LMEVAL_FILES[1])
    for case_id in run.cases.case_id:
        a, b = ref[case_id]["resps"][0][0], other[case_id]["resps"][0][0]
        assert diverged(run.cases, case_id) == (a != b)
        step = reported(run.cases, case_id, "first_divergence")
        if step is None:
            continue
        units = run.tokens[(run.tokens.case_id == case_id) & (run.tokens.composition == "c1")].sort_values("step")
        before = "".join(units.token.iloc[:int(step)])
        assert a.startswith(before) and b.startswith(before)  # identical up to the reported unit ...
        assert a[len(before):len(before) + 1] != b[len(before):len(before) + 1] or len(a) != len(b)
    for row in run.runs.itertuples():
        logged = (ref if row.composition == "c1" else other)[row.case_id]
        assert row.passed == (logged["exact_match"] == 1.0)


@pytest.mark.parametrize(("name", "content", "where"), [
    ("notes.eval", b"not a zip at all\n", "not an inspect_ai .eval log"),
    ("truncated.eval", None, "quick"),
    ("other.json", b'{"hello": "world"}', "not an inspect_ai log"),
    ("broken.json", b'{"eval": {', "malformed JSON"),
])
def test_a_file_that_is_not_an_inspect_log_exits_2_naming_it_and_writes_nothing(
        capsys, tmp_path: Path, name: str, content: bytes | None, where: str) -> None:
    bad = tmp_path / name
    bad.write_bytes(content if content is not None else INSPECT_LOGS[0].read_bytes()[:20000])
    code, out, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], bad, "--out", tmp_path / "run", "--suite",
                             tmp_path / "s.jsonl")
    assert code == 2
    assert str(bad) in err
    if content is not None:
        assert where in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "s.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary left behind either


def test_a_bad_lm_eval_line_exits_2_naming_file_line_and_field(capsys, tmp_path: Path) -> None:
    lines = LMEVAL_FILES[0].read_text().splitlines()
    broken = json.loads(lines[2])
    del broken["arguments"]
    bad = tmp_path / LMEVAL_FILES[0].name
    bad.write_text("\n".join([lines[0], lines[1], json.dumps(broken), *lines[3:]]) + "\n")
    code, _, err = run_cli(capsys, "import", "lm-eval", bad, "--suite", tmp_path / "s.jsonl")
    assert code == 2
    assert f"{bad}:3" in err and "arguments" in err
    assert not (tmp_path / "s.jsonl").exists()


def test_missing_and_errored_samples_and_other_tasks_or_models_are_reported(capsys, tmp_path: Path) -> None:
    from flakecheck.harness.inspect_zip import read_eval_zip

    log = read_eval_zip(INSPECT_LOGS[1])  # the c16 log as a .json log: one sample dropped, one errored, one added
    kept = [s for s in log["samples"] if s["id"] != "q3"]
    kept.append({**kept[0], "id": "q9"})
    errored = next(s for s in kept if s["id"] == "q5")
    errored["error"] = {"message": "RuntimeError: the server went away", "traceback": "", "traceback_ansi": ""}
    log["eval"] = {**log["eval"], "task": "quick_v2", "model": "openai-api/other/model"}
    (tmp_path / "c16.json").write_text(json.dumps({**log, "samples": kept}))
    code, _, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], tmp_path / "c16.json", "--out",
                           tmp_path / "run", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert "q3" not in set(run.cases.case_id) and "q5" not in set(run.cases.case_id)
    skipped = {s["sample_id"]: s["reason"] for s in run.meta["import"]["skipped"]}
    assert skipped["q3"] == skipped["q9"] == "missing" and "the server went away" in skipped["q5"]
    assert "sample q3 left out" in err and "sample q5 left out" in err and "sample q9 left out" in err
    assert len(run.cases) == 6
    for what in ("different tasks", "different models"):
        assert what in err and any(what in w for w in run.meta["import"]["warnings"])


def test_the_reference_and_the_names_can_be_chosen(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "import", "lm-eval", *LMEVAL_FILES, "--out", tmp_path / "run", "--names",
                           "serial,busy", "--reference", "busy", "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    assert run.meta["reference"] == "busy" and [c["name"] for c in run.meta["compositions"]] == ["busy", "serial"]
    code, _, err = run_cli(capsys, "import", "lm-eval", *LMEVAL_FILES, "--out", tmp_path / "run2", "--names", "a,a")
    assert code == 2 and "differ" in err


def test_one_log_makes_a_suite_but_not_a_run_directory(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], "--out", tmp_path / "run")
    assert code == 2 and "two or more" in err and not (tmp_path / "run").exists()


def _profile(path: Path, shift_at_8: float) -> Path:
    """A server's noise profile as `flakecheck conformance` writes it: nothing moves serially, `shift_at_8` at 8
    requests in flight."""
    path.mkdir()
    (path / "noise.json").write_text(json.dumps({"unit": "logprob", "dtype": "bfloat16", "levels": [
        {"axis": "run_to_run", "level": "serial", "in_flight": 1, "shifts": [0.0] * 50},
        {"axis": "co_resident", "level": "n8", "in_flight": 8, "shifts": [0.0] * 25 + [shift_at_8] * 25}]}))
    return path


def test_one_log_and_the_servers_noise_make_a_run_directory_of_predictions(capsys, tmp_path: Path) -> None:
    noisy = _profile(tmp_path / "noisy", 0.5)
    code, _, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], "--out", tmp_path / "run", "--noise", noisy,
                           "--no-html")
    assert code == 0, err
    run = load_run(tmp_path / "run")
    predicted = run.cases.set_index("case_id").p_flip_pred
    gaps = run.tokens.groupby("case_id").gap.min()
    for case_id, p in predicted.items():  # a case with a gap under the shift may flip; one without cannot
        assert (p > 0) == (gaps[case_id] < 0.5 + 1e-6), case_id
    assert run.meta["flip"]["noise_source"]["source"] == "server"
    code, _, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], "--out", tmp_path / "serial", "--noise",
                           noisy, "--noise-in-flight", "4", "--no-html")
    assert code == 0, err
    assert (load_run(tmp_path / "serial").cases.p_flip_pred == 0).all()  # below 8 in flight nothing moved
    code, _, err = run_cli(capsys, "import", "inspect", INSPECT_LOGS[0], "--out", tmp_path / "bad", "--noise",
                           tmp_path / "nowhere")
    assert code == 2 and "noise.json" in err and not (tmp_path / "bad").exists()


def test_without_results_json_the_lm_eval_scorer_is_not_mapped_and_the_target_is_not_a_check(
        capsys, tmp_path: Path) -> None:
    alone = tmp_path / LMEVAL_FILES[0].name
    shutil.copy(LMEVAL_FILES[0], alone)
    code, _, err = run_cli(capsys, "import", "lm-eval", alone, "--suite", tmp_path / "s.jsonl")
    assert code == 0 and "no results_*.json" in err
    case = load_suite(tmp_path / "s.jsonl").cases[0]
    assert not case.checks and not case.targets  # an exact-match default would not be the harness's rule
    assert case.metadata["target"] == "Paris" and case.metadata["scorer_mapped"] is False


INSPECT_TABLE = [
    ("includes", {}, "icontains"),
    ("includes", {"ignore_case": False}, "contains"),
    ("match", {"location": "begin", "numeric": True}, "match"),
    ("exact", {}, "exact"),
    ("pattern", {"pattern": r"ANSWER: (\w+)"}, "regex"),
    ("answer", {"pattern": "letter"}, "regex"),
    ("choice", {"_multiple_choice": {"shuffle": False, "multiple_correct": False}}, "choice"),
    ("choice", {"_multiple_choice": {"shuffle": True, "multiple_correct": False}}, None),
    ("model_graded_qa", {}, None),
    ("model_graded_fact", {"model": "openai/gpt-4o"}, None),
    ("f1", {}, None),
    ("my_rubric", {}, None),
]


@pytest.mark.parametrize(("name", "options", "check_type"), INSPECT_TABLE,
                         ids=[f"{t[0]}-{t[2]}" for t in INSPECT_TABLE])
def test_inspect_scorer_mapping_table(name: str, options: dict, check_type: str | None) -> None:
    log = HarnessLog(Path("x.eval"), "inspect_ai", "t", "m", [], ScorerSpec(name, options))
    mapping = map_scorer(log)
    assert mapping.mapped == (check_type is not None)
    if check_type is None:
        assert "not mapped" in mapping.note
        return
    assert mapping.template is not None and mapping.template[0]["type"] == check_type
    for check in mapping.template:  # every mapped check is one the suite format accepts
        parse_check(check, "x", 1, "checks[0]")


@pytest.mark.parametrize(("metric", "steps", "mapped"), [
    ("exact_match", [{"function": "regex", "regex_pattern": r"(\d+)"}, {"function": "take_first"}], True),
    ("exact_match", [{"function": "multi_choice_regex", "regex_pattern": r"(\d+)"}], False),
    ("bleu", [{"function": "take_first"}], False),
])
def test_lm_eval_scorer_mapping_table(metric: str, steps: list, mapped: bool) -> None:
    spec = ScorerSpec(metric, {"filter": "f", "filter_steps": steps, "metric_options": {"ignore_case": True},
                               "config_found": True})
    mapping = map_scorer(HarnessLog(Path("s.jsonl"), "lm-eval", "t", "m", [], spec))
    assert mapping.mapped == mapped
    if not mapped:
        assert "not map" in mapping.note


def test_the_lm_eval_reader_knows_the_tasks_filters_from_the_results_file() -> None:
    log = read_lmeval_samples(LMEVAL_FILES[0])
    assert log.task == "flk_quick" and log.concurrency == 1 and log.model == "smollm2"
    assert log.scorer is not None and log.scorer.params["filter"] == "last-word"
