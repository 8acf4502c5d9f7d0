"""RunConfig: validated once; its command line, its meta.json form and its fingerprint agree with it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flakecheck import cli
from flakecheck.cli import run as cli_run  # the module: the command is cli.run_cli
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition, Fillers
from flakecheck.errors import UserError
from flakecheck.run.settings import RunConfig

compositions = st.lists(
    st.builds(
        Composition,
        name=st.sampled_from(["solo", "b4", "x.y", "load-2"]),
        max_batch=st.integers(1, 64),
        order_seed=st.none() | st.integers(0, 9),
        chunk=st.none() | st.integers(1, 512),
        prefix_cache=st.booleans(),
        fillers=st.builds(Fillers, count=st.integers(0, 9), prompt_len=st.just((4, 9)), seed=st.integers(0, 3)),
        arrival=st.sampled_from(["together", "staggered"]),
    ),
    min_size=1, max_size=4, unique_by=lambda c: c.name,
)
configs = st.builds(
    RunConfig.parse,
    suite=st.sampled_from([Path("s.jsonl"), Path("my suite.jsonl")]),
    model=st.sampled_from(["smollm2", "./dir with space"]),
    dtype=st.sampled_from(["bfloat16", "float32"]),
    kernels=st.sampled_from(["splitk", "invariant", "native", "matmul=splitk,attention=invariant"]),
    profile=st.sampled_from(["h100", "l4"]),
    compositions=compositions | st.just(DEFAULT_COMPOSITIONS),
    max_tokens=st.integers(1, 99),
    gap_threshold=st.sampled_from([0.05, 0.125, 2.0]),
    repeat=st.integers(1, 3),
    limit=st.none() | st.integers(1, 9),
    ids=st.lists(st.sampled_from(["a", "b-1", "c"]), unique=True).map(tuple),
    replay=st.sampled_from(["auto", "physical"]),
    out=st.none() | st.just(Path("reports/x y")),
    html=st.booleans(),
    input_format=st.sampled_from(["auto", "chat", "raw"]),
)


def parsed_by_the_cli(argv: list[str], monkeypatch) -> RunConfig:
    """The RunConfig `flakecheck run` builds from argv (the run itself is not started)."""
    seen: list[RunConfig] = []
    monkeypatch.setattr(cli_run, "execute", lambda config, **kwargs: seen.append(config) or sys.exit(0))
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        cli.main()
    assert len(seen) == 1
    return seen[0]


@settings(max_examples=60, deadline=None)
@given(configs)
def test_the_command_line_of_a_config_builds_the_same_config(config: RunConfig) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert parsed_by_the_cli(shlex.split(config.command()), monkeypatch) == config


@settings(max_examples=60, deadline=None)
@given(configs)
def test_meta_json_form_round_trips(config: RunConfig) -> None:
    assert RunConfig.from_dict(config.to_dict()) == config


@given(configs)
def test_fixed_order_and_resume_commands(config: RunConfig) -> None:
    fixed = RunConfig.from_dict({**config.to_dict(), "kernels": "invariant", "out": None})
    assert config.fixed_order_command() == fixed.command()
    resume = shlex.split(config.resume_command(Path("r")))
    assert resume[-1] == "--resume" and resume[resume.index("--out") + 1] == "r"


def test_thresholds_and_replay_mode_do_not_decide_the_traces() -> None:
    base = RunConfig.parse(Path("s.jsonl"))
    same = RunConfig.parse(Path("s.jsonl"), gap_threshold=0.5, gap_window=3, replay="physical", html=False)
    assert base.trace_settings() == same.trace_settings()
    for changed in (RunConfig.parse(Path("s.jsonl"), kernels="invariant"),
                    RunConfig.parse(Path("s.jsonl"), max_tokens=3),
                    RunConfig.parse(Path("s.jsonl"), compositions=(Composition("solo"),)),
                    RunConfig.parse(Path("s.jsonl"), input_format="raw")):
        assert changed.trace_settings() != base.trace_settings()


@pytest.mark.parametrize("bad, field", [
    ({"max_tokens": 0}, "--max-tokens"), ({"repeat": True}, "--repeat"), ({"gap_threshold": 0}, "--gap-threshold"),
    ({"dtype": "int8"}, "dtype"), ({"kernels": "matmul=fast"}, "--kernels"), ({"kernels": "speed=splitk"}, "--kernels"),
    ({"profile": "tpu"}, "profile"), ({"replay": "lazy"}, "--replay"), ({"limit": 0}, "--limit"),
    ({"input_format": "xml"}, "--input-format"),
])
def test_bad_settings_are_refused_naming_the_option(bad: dict, field: str) -> None:
    with pytest.raises(UserError, match=field):
        RunConfig.parse(Path("s.jsonl"), **bad)
