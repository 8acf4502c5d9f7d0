"""A report that fails to render never costs the run (issue 11): the run directory is complete, the summary
prints, and the error names the run directory and the command that renders it again; exit status 3."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.data.rundir import load_run
from flakecheck.reports import html as html_module
from flakecheck.reports import terminal
from flakecheck.reports.finished import ReportError
from tests.test_run import cli_run


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in [
        {"id": "a", "input": "What is 2 + 2?", "target": "4"},
        {"id": "b", "prompt": "The capital of Italy is", "checks": [{"type": "contains", "value": "Rome"}]},
    ]) + "\n")
    return path


def _broken(*args, **kwargs):
    raise TypeError("'int' object is not iterable")


def _run_args(tmp_path: Path, model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(_suite(tmp_path)), "--model", str(model_dir), "--out", str(out), "--kernels", "invariant",
            "--composition", "name=solo", "--composition", "name=b2,max_batch=2", "--max-tokens", "3", *extra]


def _assert_complete(out: Path) -> None:
    run = load_run(out)  # loadable: every table and meta.json
    assert len(run.cases) == 2 and not (out / "partial").exists()
    assert run.meta["status"] == "complete" and "total_s" in run.meta["timings"]


def test_html_failure_keeps_the_run_prints_the_summary_and_the_rerender_command(tiny_model_dir, tmp_path,
                                                                                 monkeypatch, capsys) -> None:
    monkeypatch.setattr(html_module, "write_html", _broken)
    out = tmp_path / "run"
    code, stdout, err = cli_run(monkeypatch, capsys, *_run_args(tmp_path, tiny_model_dir, out, "--quiet"))
    assert code == 3
    assert str(out) in stdout and "2 cases" in stdout  # the summary line came first
    rerender = shlex.join(["flakecheck", "report", str(out), "--html", str(out / "report.html")])
    flat = " ".join(err.split())
    assert rerender in flat and "is complete" in flat and "TypeError" in flat
    assert "Traceback" not in err and "internal error" not in err
    assert not (out / "report.html").exists()
    _assert_complete(out)


def test_summary_failure_still_writes_html_and_says_how_to_print_it(tiny_model_dir, tmp_path, monkeypatch,
                                                                     capsys) -> None:
    monkeypatch.setattr(terminal, "render_summary", _broken)
    out = tmp_path / "run"
    code, _, err = cli_run(monkeypatch, capsys, *_run_args(tmp_path, tiny_model_dir, out))
    assert code == 3 and "Traceback" not in err
    assert f"flakecheck report {out}" in " ".join(err.split())
    assert (out / "report.html").is_file()
    _assert_complete(out)


def test_the_api_raises_report_error_carrying_the_complete_run(tiny_model_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(html_module, "write_html", _broken)
    out = tmp_path / "api"
    with pytest.raises(ReportError) as info:
        flakecheck.run_suite(_suite(tmp_path), model=str(tiny_model_dir), kernels="invariant", max_tokens=3,
                             out=out, compositions=[Composition("solo")])
    assert info.value.run.path == out and len(info.value.run.cases) == 2
    _assert_complete(out)
