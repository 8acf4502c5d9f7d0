"""One home for report formats: every rendering command takes the same `--format` from the registry, and the
old flags (`--json`, `--markdown PATH`, `--junit PATH`, `--html PATH`) are aliases giving the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.main

from flakecheck import cli
from flakecheck.errors import UserError
from flakecheck.reports.formats import FORMATS, Outputs, choose_outputs, offered
from tests.fixtures_runs import *  # noqa: F403
from tests.harness_helpers import run_cli

RENDERING = ("report", "gate", "compare", "conformance", "explain", "diff")


def _params(command: str) -> dict[str, object]:
    group = typer.main.get_command(cli.app)
    return {p.name: p for p in group.commands[command].params}


def test_every_rendering_command_takes_the_same_format_option_from_the_registry() -> None:
    for command in RENDERING:
        option = _params(command)["format"]
        assert option.opts == ["--format"] and option.multiple, command
        names = offered(command)
        assert "terminal" in names and len(names) >= 2, command
        assert all(command in FORMATS[n].commands for n in names)
        assert " | ".join(names) in option.help, command  # the help names exactly what the command renders


def test_old_flags_fold_into_the_same_choice() -> None:
    assert choose_outputs((), "diff") == Outputs("terminal", ())
    assert choose_outputs((), "diff", json=True) == choose_outputs(["json"], "diff") == Outputs("json", ())
    old = choose_outputs((), "gate", files={"junit": Path("j.xml"), "markdown": None})
    assert old == choose_outputs(["junit=j.xml"], "gate") == Outputs("terminal", (("junit", Path("j.xml")),))
    both = choose_outputs(["markdown=m.md", "JSON"], "report")
    assert both.stdout == "json" and both.files == (("markdown", Path("m.md")),) and both.wants("markdown")


@pytest.mark.parametrize(("given", "json_flag", "message"), [
    (["yaml"], False, "unknown --format 'yaml'"),
    (["junit"], False, "`report` does not render junit"),
    (["terminal=out.txt"], False, "stdout only"),
    (["markdown="], False, "give the file"),
    (["markdown"], True, "one format on stdout"),
])
def test_a_format_a_command_cannot_render_is_refused_naming_the_option(given, json_flag, message) -> None:
    with pytest.raises(UserError, match="--format") as info:
        choose_outputs(given, "report", json=json_flag)
    assert message in str(info.value)


def test_gate_writes_the_same_files_through_format_as_through_the_old_flags(splitk_report_run, tmp_path: Path,
                                                                              capsys) -> None:
    run = str(splitk_report_run.path)
    limits = ("--max-flaky-rate", "1", "--max-verdict-flips", "1000")
    old = run_cli(capsys, "gate", run, *limits, "--junit", tmp_path / "old.xml", "--markdown", tmp_path / "old.md")
    new = run_cli(capsys, "gate", run, *limits, "--format", f"junit={tmp_path / 'new.xml'}",
                  "--format", f"markdown={tmp_path / 'new.md'}")
    assert old[0] == new[0] == 0 and old[1] == new[1]
    for suffix in ("xml", "md"):
        assert (tmp_path / f"new.{suffix}").read_bytes() == (tmp_path / f"old.{suffix}").read_bytes()
    code, out, _ = run_cli(capsys, "gate", run, *limits, "--format", "markdown")
    assert code == 0 and out == (tmp_path / "new.md").read_text()


def test_report_prints_or_writes_each_format_and_refuses_another_commands(splitk_report_run, tmp_path: Path,
                                                                            capsys) -> None:
    run = str(splitk_report_run.path)
    code, printed, _ = run_cli(capsys, "report", run, "--format", "json", "--format", f"html={tmp_path / 'a.html'}")
    assert code == 0 and json.loads(printed)["n_cases"] == len(splitk_report_run.cases)
    assert run_cli(capsys, "report", run, "--html", tmp_path / "b.html")[0] == 0
    assert (tmp_path / "a.html").read_text() == (tmp_path / "b.html").read_text()
    code, html, _ = run_cli(capsys, "report", run, "--format", "html")
    assert code == 0 and html == (tmp_path / "a.html").read_text()
    code, _, err = run_cli(capsys, "report", run, "--format", "junit")
    assert code == 2 and "does not render junit" in err and not list(tmp_path.glob("*.xml"))


def test_compare_json_through_format_is_the_old_json(splitk_report_run, invariant_report_run, capsys) -> None:
    runs = (str(splitk_report_run.path), str(invariant_report_run.path))
    old = run_cli(capsys, "compare", *runs, "--json")
    new = run_cli(capsys, "compare", *runs, "--format", "json")
    assert old[0] == new[0] == 0 and old[1] == new[1] and json.loads(new[1])
