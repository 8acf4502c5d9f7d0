"""`flakecheck report` in every format, from a copied run directory (no model), and the summary."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from flakecheck.cli.report import report_command
from flakecheck.data.compositions import Composition, parse_composition_spec
from flakecheck.data.rundir import STATUSES, load_run
from flakecheck.errors import UserError
from flakecheck.reports.facts import gather, invariant_rerun, next_command
from flakecheck.reports.markdown import md_text
from flakecheck.reports.terminal import render_summary, summary_line
from flakecheck.run.settings import RunConfig
from tests.fixtures_runs import *  # noqa: F403


def _no_nan(text: str) -> None:
    raise AssertionError(f"non-JSON constant {text} in the report")


@pytest.fixture
def copied_run(splitk_report_run, tmp_path: Path) -> Path:
    """The run directory copied elsewhere: reports must need nothing but its files."""
    return Path(shutil.copytree(splitk_report_run.path, tmp_path / "copied-run"))


def test_json_report_from_a_copied_run_states_the_tables_facts(copied_run: Path, capsys) -> None:
    assert report_command(copied_run, format="json", html=None, top=3) == 0
    report = json.loads(capsys.readouterr().out, parse_constant=_no_nan)
    cases = load_run(copied_run).cases
    assert report["run_dir"] == str(copied_run)
    assert report["n_cases"] == len(cases)
    assert report["counts"] == {s: int((cases.status == s).sum()) for s in STATUSES}
    assert sorted(report["verdict_flips"]) == sorted(cases[cases.verdict_flip].case_id)
    top = report["top"]
    assert len(top) <= 3 and all(c["status"] != "stable" for c in top)
    # no draws in this run: ordered by the predicted flip probability
    assert [c["p_flip_pred"] for c in top] == sorted((c["p_flip_pred"] for c in top), reverse=True)
    non_stable = cases[cases.status != "stable"]
    if len(top) < 3:  # fewer than asked only when there are no more non-stable cases
        assert len(top) == len(non_stable)
    elif len(non_stable):
        assert min(c["p_flip_pred"] for c in top) >= non_stable.p_flip_pred.nlargest(3).min()


def test_markdown_report_lists_counts_and_escapes_text(copied_run: Path, capsys) -> None:
    assert report_command(copied_run, format="markdown", html=None, top=10) == 0
    text = capsys.readouterr().out
    cases = load_run(copied_run).cases
    for status in STATUSES:
        assert f"| {status} | {int((cases.status == status).sum())} |" in text
    assert "<script" not in text and "<b>" not in text


def test_a_simulations_report_says_its_predictions_describe_its_profile_not_the_server(copied_run: Path,
                                                                                     capsys) -> None:
    run = load_run(copied_run)
    profile = run.meta["flip"]["noise_source"]["profile"]
    assert run.meta["flip"]["noise_source"]["source"] == "simulation"
    assert report_command(copied_run, format="markdown", html=None, top=10) == 0
    markdown = capsys.readouterr().out
    assert report_command(copied_run, format="terminal", html=None, top=10) == 0
    terminal = capsys.readouterr().out
    html_path = copied_run.parent / "report.html"
    assert report_command(copied_run, format="terminal", html=html_path, top=10) == 0
    html = " ".join(html_path.read_text().split())
    for text in (markdown, " ".join(terminal.split()), html):
        assert f"describe the simulated {profile} profile" in text and "not your server" in text


def test_the_html_report_says_which_noise_predicted_escaped(copied_run: Path, capsys) -> None:
    meta_path = copied_run / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["flip"]["noise_source"] = {"source": "server", "endpoint": "http://h/<script>alert(1)</script>",
                                    "server_version": "1.0 & <b>x</b>", "in_flight": 8, "prefix": False,
                                    "levels": ["co_resident.n8"], "changed": 0.5}
    meta_path.write_text(json.dumps(meta))
    html_path = copied_run.parent / "server.html"
    assert report_command(copied_run, format="terminal", html=html_path, top=5) == 0
    capsys.readouterr()
    html = html_path.read_text()
    note = html[html.index('id="prediction-note"'):]
    note = note[:note.index("</p>")]
    assert "the server's own noise" in note.replace("&#39;", "'") and "8 requests in flight" in note
    assert "co_resident.n8" in note
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in note and "<script>alert" not in html
    assert "1.0 &amp; &lt;b&gt;x&lt;/b&gt;" in note


def test_report_writes_html_from_the_copy(copied_run: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "out" / "copy.html"
    assert report_command(copied_run, format="terminal", html=target, top=5) == 0
    out = capsys.readouterr().out
    assert str(copied_run) in out
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>") and all(str(c) in html for c in load_run(copied_run).cases.case_id)


def test_unreadable_or_incomplete_run_dirs_and_bad_options_are_user_errors(copied_run: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError):
        report_command(tmp_path / "missing", format="terminal", html=None, top=10)
    (copied_run / "cases.parquet").unlink()
    with pytest.raises(UserError, match="cases.parquet"):
        report_command(copied_run, format="json", html=None, top=10)
    with pytest.raises(UserError, match="format"):
        report_command(copied_run, format="yaml", html=None, top=10)


def test_summary_line_counts_each_status_and_names_the_run(splitk_report_run) -> None:
    line = summary_line(splitk_report_run)
    cases = splitk_report_run.cases
    assert "\n" not in line and str(splitk_report_run.path) in line
    assert f"{len(cases)} cases" in line
    for status in STATUSES:
        assert f"{int((cases.status == status).sum())} {status}" in line
    assert f"{len(splitk_report_run.meta['compositions'])} compositions" in line


def test_render_summary_shows_the_likeliest_flips_and_the_next_command(splitk_report_run) -> None:
    console = Console(record=True, width=200)
    render_summary(splitk_report_run, console, top=2)
    text = console.export_text()
    assert str(splitk_report_run.path) in text
    _, command = next_command(gather(splitk_report_run))
    assert command in text
    non_stable = splitk_report_run.cases[splitk_report_run.cases.status != "stable"]
    for case_id in non_stable.sort_values(["p_flip_pred", "case_id"], ascending=[False, True]).case_id[:2]:
        assert str(case_id) in text
    # how the traces were made, from the run's own meta.json
    meta = splitk_report_run.meta
    assert f"replay: {meta['replay']}" in text
    if meta["replay"] == "simulated":
        assert f"{meta['replay_stats']['forward_passes']:,} shared forward passes" in text
        stats = meta["replay_stats"]
        shared, total = stats["shared_rows"], stats["shared_rows"] + stats["rows"] + stats["skipped_rows"]
        assert (f"{shared:,} of {total:,} rows computed once" in text) == (shared > 0)


def test_next_command_follows_policy_and_divergence(splitk_report_run, tight_invariant_run) -> None:
    facts = gather(splitk_report_run)
    diverged = bool(splitk_report_run.cases.status.isin(["flaky", "verdict_flaky"]).any())
    _, command = next_command(facts)
    if diverged:
        assert "--kernels invariant" in command and "flakecheck run" in command
    else:
        assert command.startswith("flakecheck gate")
    _, command = next_command(gather(tight_invariant_run))  # invariant: nothing left to confirm
    assert command.startswith("flakecheck gate") and str(tight_invariant_run.path) in command


def test_invariant_rerun_replaces_kernels_and_drops_the_run_directory(splitk_report_run) -> None:
    recorded = RunConfig.parse(Path("my suite.jsonl"), kernels="splitk", out=Path("reports/x"), limit=3,
                               compositions=(Composition("solo"), Composition("b4", max_batch=4, chunk=16)))
    facts = gather(splitk_report_run)
    facts = dataclasses.replace(facts, record=dataclasses.replace(
        facts.record, fixed_order_command=recorded.fixed_order_command()))
    argv = shlex.split(invariant_rerun(facts))
    assert argv[:3] == ["flakecheck", "run", "my suite.jsonl"]
    assert argv.count("--kernels") == 1 and argv[argv.index("--kernels") + 1] == "invariant"
    assert "--out" not in argv and "--resume" not in argv
    assert "--limit" in argv and argv[argv.index("--limit") + 1] == "3"
    # every other setting survives: the command parses back to the same run with fixed-order kernels
    specs = [argv[i + 1] for i, a in enumerate(argv) if a == "--composition"]
    assert tuple(parse_composition_spec(s) for s in specs) == recorded.compositions


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "a | b", "`x` *y* [z](u)", "line\nbreak"])
def test_markdown_text_cannot_inject_html_or_break_a_table(text: str) -> None:
    cell = md_text(text)
    assert "<" not in cell and ">" not in cell and "\n" not in cell
    assert "|" not in cell.replace("\\|", "")
