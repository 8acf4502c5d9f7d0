"""`flakecheck run` end to end on the tiny random model: the properties issue 4 asks for."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest
import torch

import flakecheck
from flakecheck import api, cli
from flakecheck.data.rundir import RunDirectory, load_run
from flakecheck.engine import LoadedModel, load_model
from flakecheck.engine.spec import EngineSpec
from flakecheck.errors import UserError
from flakecheck.kernels.policy import parse_policy

QUESTIONS = [
    "What is the capital of France?", "What is 17 + 25?", "Name three primary colours.",
    "Translate 'good morning' to Spanish.", "Write a haiku about autumn leaves falling slowly.",
    "Is 97 a prime number? Answer yes or no.", "Which planet is the largest in our solar system?",
    "Complete: def add(a, b):", "Give the JSON for a person named Ada aged 36.",
    "Answer with one letter. Which is a mammal? A) shark B) whale C) trout D) squid",
]


def write_suite(path: Path) -> Path:
    lines = []
    for i, q in enumerate(QUESTIONS):
        case: dict = {"id": f"q{i}", "input": [{"role": "user", "content": q * (1 + i % 3)}],
                      "target": "Paris" if i == 0 else "42", "max_tokens": 10}
        if i % 4 == 1:
            case["checks"] = [{"type": "contains", "value": "a"}]
        lines.append(json.dumps(case))
    lines.append(json.dumps({"id": "raw", "prompt": "The <script>alert(1)</script> tag", "max_tokens": 8}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("suite") / "tiny.jsonl")


@pytest.fixture(scope="session")
def tiny_bf16(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def run(tiny_bf16, suite: Path, out: Path, kernels: str):
    return flakecheck.run_suite(suite, model=tiny_bf16, kernels=kernels, max_tokens=10, out=out, html=False)


@pytest.fixture(scope="session")
def splitk_run(tiny_bf16, tiny_suite: Path, tmp_path_factory: pytest.TempPathFactory):
    return run(tiny_bf16, tiny_suite, tmp_path_factory.mktemp("runs") / "splitk", "splitk")


def test_run_directory_matches_the_design(splitk_run) -> None:
    names = {p.name for p in splitk_run.path.iterdir()}
    assert {"runs.parquet", "tokens.parquet", "cases.parquet", "meta.json"} <= names
    assert "partial" not in names
    n_cases, n_comps = len(QUESTIONS) + 1, len(splitk_run.meta["compositions"])
    assert len(splitk_run.runs) == n_cases * n_comps
    assert len(splitk_run.tokens) == splitk_run.runs.n_tokens.sum()
    assert set(splitk_run.cases.status) <= {"stable", "fragile", "flaky", "verdict_flaky"}
    for key in ("command", "versions", "engine", "pinning", "thresholds", "suite_sha256", "timings"):
        assert key in splitk_run.meta
    # the engine is written once and read back typed: what computed the run, on which machine, what it verified
    spec = EngineSpec.from_dict(splitk_run.meta["engine"])
    assert spec.policy == parse_policy("splitk") and spec.device == "cpu" and spec.backend == "torch"
    assert spec.machine.threads >= 1 and spec.machine.torch == torch.__version__
    assert set(spec.verification.needed) == {"split_matmul", "attention", "norm", "softmax"}
    assert spec.simulated == (splitk_run.meta["replay"] == "simulated")
    assert "policy" not in splitk_run.meta and splitk_run.meta["config"]["kernels"] == "splitk"
    gaps = splitk_run.tokens.top1_logprob - splitk_run.tokens.top2_logprob
    assert (splitk_run.tokens.gap - gaps).abs().max() < 1e-6 and (splitk_run.tokens.gap >= 0).all()


def test_invariant_kernels_give_bitwise_identical_output_under_every_composition(tiny_bf16, tiny_suite, tmp_path):
    result = run(tiny_bf16, tiny_suite, tmp_path / "inv", "invariant")
    assert result.runs.first_divergence.isna().all()
    assert set(result.cases.status) <= {"stable", "fragile"}
    per_step = result.tokens.groupby(["case_id", "step"])
    assert (per_step.token_id.nunique() == 1).all()
    assert (per_step.top1_logprob.nunique() == 1).all() and (per_step.top2_logprob.nunique() == 1).all()


def test_splitk_diverges_and_every_reported_divergence_matches_the_tokens(splitk_run) -> None:
    runs = splitk_run.runs
    assert runs.first_divergence.notna().any(), "split-K should make some case diverge on the tiny model"
    reference = runs[runs.composition == splitk_run.meta["reference"]].set_index("case_id").token_ids
    for row in runs.itertuples():
        ref, alt = list(reference[row.case_id]), list(row.token_ids)
        expected = next((i for i, (a, b) in enumerate(zip(ref, alt)) if a != b),
                        None if len(ref) == len(alt) else min(len(ref), len(alt)))
        got = None if pd.isna(row.first_divergence) else int(row.first_divergence)
        assert got == expected, (row.case_id, row.composition)
    tokens = splitk_run.tokens.set_index(["case_id", "composition", "step"]).token
    for case in splitk_run.cases[splitk_run.cases.first_divergence.notna()].itertuples():
        step = int(case.first_divergence)
        assert step == runs[runs.case_id == case.case_id].first_divergence.min()
        assert case.ref_token == tokens[(case.case_id, splitk_run.meta["reference"], step)]
        assert case.alt_token == tokens[(case.case_id, case.divergence_composition, step)]
        assert case.status in ("flaky", "verdict_flaky")


def test_the_tool_is_deterministic(tiny_bf16, tiny_suite, splitk_run, tmp_path) -> None:
    again = run(tiny_bf16, tiny_suite, tmp_path / "again", "splitk")
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(again, table), getattr(splitk_run, table))


@pytest.mark.parametrize("replay", ["simulated", "physical"])
def test_resume_after_an_interruption_gives_the_uninterrupted_result(tiny_bf16, tiny_suite, splitk_run, tmp_path,
                                                                      monkeypatch, replay) -> None:
    real_save, saved = RunDirectory.save_traces, []

    def interrupted_on_third(self, composition, repeat, traces):
        if len(saved) == 2:
            raise KeyboardInterrupt
        saved.append(composition)
        return real_save(self, composition, repeat, traces)

    monkeypatch.setattr(RunDirectory, "save_traces", interrupted_on_third)
    out = tmp_path / "resumed"
    with pytest.raises(api.RunInterrupted, match="--resume"):
        flakecheck.run_suite(tiny_suite, model=tiny_bf16, kernels="splitk", max_tokens=10, out=out, html=False,
                             replay=replay)
    assert len(list((out / "partial").glob("*.parquet"))) == 2 and not (out / "runs.parquet").exists()
    replayed = []
    monkeypatch.setattr(RunDirectory, "save_traces",
                        lambda self, c, r, t: replayed.append(c) or real_save(self, c, r, t))
    resumed = flakecheck.run_suite(tiny_suite, model=tiny_bf16, kernels="splitk", max_tokens=10, out=out,
                                   resume=True, html=False, replay=replay)
    assert sorted(replayed + saved) == sorted(c["name"] for c in splitk_run.meta["compositions"])
    for table in ("runs", "tokens", "cases"):  # finished compositions were read back, not redone
        pd.testing.assert_frame_equal(getattr(resumed, table), getattr(splitk_run, table))


def test_resume_refuses_changed_settings(tiny_bf16, tiny_suite, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(RunDirectory, "save_traces", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(api.RunInterrupted):
        run(tiny_bf16, tiny_suite, tmp_path / "r", "splitk")
    with pytest.raises(UserError, match="kernels"):
        flakecheck.run_suite(tiny_suite, model=tiny_bf16, kernels="invariant", max_tokens=10, out=tmp_path / "r",
                             resume=True, html=False)


def _exit_code(argv: Sequence[str]) -> int:
    """`flakecheck ARGV` in this process; its exit code."""
    old = sys.argv
    sys.argv = ["flakecheck", *argv]
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
            raise SystemExit(0)
    finally:
        sys.argv = old
    return int(exit_info.value.code or 0)


def cli_run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The CLI's exit code, stdout and stderr (of this process)."""
    code = _exit_code(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_cli(argv: list[str], capfd) -> tuple[int, str]:
    """The CLI's exit code and everything it wrote to the file descriptors (subprocesses included)."""
    code = _exit_code(argv)
    captured = capfd.readouterr()
    return code, captured.out + captured.err


BAD_SUITES = {
    "malformed json": ('{"id": "a", "input": "x"}\n{"id": "b", "input": \n', 2, None),
    "missing input": ('{"id": "a", "input": "x"}\n{"id": "b", "target": "y"}\n', 2, "input"),
    "wrong type": ('{"id": "a", "input": 3}\n', 1, "input"),
    "duplicate id": ('{"id": "a", "input": "x"}\n{"id": "a", "input": "y"}\n', 2, "id"),
    "unknown check": ('{"id": "a", "input": "x", "checks": [{"type": "telepathy", "value": 1}]}\n', 1, "checks"),
    "invalid regex": ('{"id": "a", "input": "x", "checks": [{"type": "regex", "value": "(["}]}\n', 1, "checks"),
    "too long": ('{"id": "a", "input": "x"}\n{"id": "b", "prompt": "' + "word " * 600 + '"}\n', 2, "input"),
}


@pytest.mark.parametrize("kind", sorted(BAD_SUITES))
def test_bad_input_exits_2_naming_file_line_and_field_and_writes_nothing(kind, tiny_model_dir, tmp_path,
                                                                         monkeypatch, capsys) -> None:
    text, line, field = BAD_SUITES[kind]
    suite = tmp_path / "bad.jsonl"
    suite.write_text(text)
    out = tmp_path / "out"
    code, _, err = cli_run(monkeypatch, capsys, "run", str(suite), "--model", str(tiny_model_dir), "--out", str(out),
                           "--quiet")
    assert code == 2, err
    assert f"bad.jsonl:{line}" in err
    if field:
        assert field in err
    assert not out.exists()


def test_empty_suite_and_bad_options_exit_2(tiny_model_dir, tmp_path, monkeypatch, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert cli_run(monkeypatch, capsys, "run", str(empty), "--model", str(tiny_model_dir))[0] == 2
    good = write_suite(tmp_path / "good.jsonl")
    for bad in (["--kernels", "magic"], ["--repeat", "0"], ["--composition", "max_batch=zero"]):
        code, _, err = cli_run(monkeypatch, capsys, "run", str(good), "--model", str(tiny_model_dir), *bad)
        assert code == 2, (bad, err)


def test_cli_run_prints_the_summary_and_load_run_reads_it(tiny_model_dir, tmp_path, monkeypatch, capsys) -> None:
    suite = write_suite(tmp_path / "cli.jsonl")
    out = tmp_path / "cli-run"
    code, stdout, err = cli_run(monkeypatch, capsys, "run", str(suite), "--model", str(tiny_model_dir), "--out",
                                str(out), "--composition", "name=solo", "--composition", "name=b4,max_batch=4",
                                "--max-tokens", "6", "--quiet")
    assert code == 0, err
    assert str(out) in stdout and len(stdout.strip().splitlines()) == 1
    loaded = load_run(out)
    assert [c["name"] for c in loaded.meta["compositions"]] == ["solo", "b4"]
    assert loaded.meta["command"].startswith("flakecheck run") and (out / "report.html").is_file()
