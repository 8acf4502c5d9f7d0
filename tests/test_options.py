"""`flakecheck run`'s options, declared once (flakecheck/run/options.py): the command line, RunConfig.parse,
run_suite, the recorded command line and meta.json all follow the one table."""

from __future__ import annotations

import inspect
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import typer.main

from flakecheck import cli, run_suite
from flakecheck.analysis.flip import server_load as load
from flakecheck.cli import run as cli_run
from flakecheck.engine import packaged_models
from flakecheck.engine import settings as engine_settings
from flakecheck.grading import external
from flakecheck.run import options
from flakecheck.run.options import CONFIG_OPTIONS, RUN_OPTIONS, cli_options
from flakecheck.run.settings import RunConfig


def test_the_literal_defaults_are_the_engines_own() -> None:
    """options.py loads with `--help`, before torch: its defaults are literals, held equal here."""
    assert options.DEFAULT_MODEL == packaged_models.DEFAULT_MODEL
    assert options.DEFAULT_LOAD == load.DEFAULT_LOAD
    assert options.DEFAULT_GPU_MEMORY_UTILIZATION == engine_settings.DEFAULT_GPU_MEMORY_UTILIZATION
    assert options.OPTIONS["grader_timeout"].default == external.DEFAULT_TIMEOUT_S


def test_every_declared_option_reaches_each_place_it_is_declared_for() -> None:
    command = typer.main.get_command(cli.app).commands["run"]
    on_cli = {p.name: p for p in command.params if p.name != "suite"}
    assert set(on_cli) == {o.name for o in RUN_OPTIONS if o.cli is not None}
    for o in RUN_OPTIONS:
        if o.cli is not None:
            assert o.option in on_cli[o.name].opts and on_cli[o.name].help == o.help, o.name
    parse = inspect.signature(RunConfig.parse).parameters
    assert list(parse) == ["suite", *(o.name for o in CONFIG_OPTIONS)]
    assert all(parse[o.name].default == o.default for o in CONFIG_OPTIONS)
    api = inspect.signature(run_suite).parameters
    assert set(api) == {"suite", *(o.name for o in RUN_OPTIONS if o.in_config or o.part == "call")}
    recorded = RunConfig.parse(Path("s.jsonl")).to_dict()
    assert set(recorded) == {"suite", "load_model", *(o.name for o in CONFIG_OPTIONS)}
    config_fields = {f.name for f in fields(RunConfig)}
    assert all(o.name in config_fields for o in RUN_OPTIONS if o.part == "field")


@pytest.mark.parametrize("command", ["diff", "serve"])
def test_the_other_commands_that_take_run_options_take_them_as_declared(command: str) -> None:
    params = {p.name: p for p in typer.main.get_command(cli.app).commands[command].params}
    declared = cli_options(command)
    assert declared and {o.name for o in declared} <= set(params)
    for o in declared:
        assert o.option in params[o.name].opts and params[o.name].help.endswith(o.help), (command, o.name)


def test_a_keyword_no_option_declares_is_refused_as_python_refuses_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
        RunConfig.parse(Path("s.jsonl"), max_token=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        run_suite("s.jsonl", seed=1)  # the command line's --seed is the API's sample_seed


def test_the_command_lines_spellings_build_the_config_the_api_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    api = RunConfig.parse(Path("s.jsonl"), ids=("a", "b"), html=False, sample=3, sample_seed=7, sample_tp="1,2",
                          grader="python 'my grader.py'", grader_timeout=12.5, ray="auto", workers=3,
                          allow_mixed_devices=True, load="uniform:2-9")
    seen: list[RunConfig] = []
    monkeypatch.setattr(cli_run, "execute", lambda config, **kwargs: seen.append(config) or sys.exit(0))
    monkeypatch.setattr(sys, "argv", shlex.split(api.command()))
    with pytest.raises(SystemExit):
        cli.main()
    assert seen == [api]
    assert {"--seed", "--tp", "--no-html", "--allow-mixed-devices", "--ids"} <= set(api.argv())
    assert RunConfig.from_dict(api.to_dict()) == api


def test_a_meta_json_written_before_an_option_existed_reads_back_as_it_meant() -> None:
    """A config block from before profile, device, the sampling and the Ray options were recorded."""
    old = {"suite": "s.jsonl", "model": "smollm2", "dtype": "bfloat16", "kernels": "invariant",
           "compositions": [{"name": "solo", "max_batch": 1}, {"name": "b4", "max_batch": 4}], "max_tokens": 16,
           "gap_threshold": 0.05, "gap_window": 50, "repeat": 1, "limit": None, "ids": [], "out": "reports/x"}
    config = RunConfig.from_dict(old)
    assert (config.engine.profile, str(config.engine.device), config.policy.name) == ("h100", "cpu", "invariant")
    assert [c.name for c in config.compositions] == ["solo", "b4"] and config.sampling is None
    assert (config.html, config.grader, config.ray, config.max_tokens) == (True, (), None, 16)
