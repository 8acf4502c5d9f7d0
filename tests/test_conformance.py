"""The conformance check against fake servers that each break one invariance on purpose: each axis reads
`breaks` for the server that breaks it, and no other axis does; a server that keeps every invariance holds
on every axis; the expectation gates; the directory is resumable and never holds the API key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakecheck.errors import UserError
from flakecheck.probe.conformance import ConformanceConfig, ConformanceFailed, ServerNoise, conformance_check
from tests.conformance_fakes import AXES, Breaks, make_breaking_app
from tests.harness_helpers import run_cli
from tests.probe_fakes import ThreadedServer

# the long prompt of the chunked-prefill axis: 120 words, longer than every target (at most 96) and than the
# fake's chunk of 100 words
SMALL = {"targets": 2, "max_tokens": 8, "max_batch": 8, "burst": 6, "chunk_budget": 80}


def _check(breaks: Breaks, out: Path, step_delay_s: float = 0.003, **settings) -> tuple[dict, int]:
    with ThreadedServer(make_breaking_app(breaks, step_delay_s)) as server:
        result = conformance_check(ConformanceConfig(server.url, out=out, **{**SMALL, **settings}))
    return result.data, result.exit_code


def _readings(data: dict) -> dict[str, str]:
    return {axis["axis"]: axis["reading"] for axis in data["axes"]}


def test_a_server_that_keeps_every_invariance_holds_on_every_axis(tmp_path: Path) -> None:
    data, code = _check(Breaks(None), tmp_path / "c", expect="invariant")
    assert code == 0 and data["failed"] == []
    assert set(_readings(data).values()) == {"holds"}
    assert all(axis["compared"] > 0 for axis in data["axes"])  # every axis compared something
    noise = ServerNoise.load(tmp_path / "c")
    assert noise.model().n > 0 and noise.model().changed == 0.0  # measured, and nothing moved


@pytest.mark.parametrize("axis", AXES)
def test_each_axis_detects_what_it_claims_and_no_other(axis: str, tmp_path: Path) -> None:
    breaks = Breaks(axis, flip_at=3 if axis == "arrival" else 8, chunk=100)
    # slow steps where the axis is about arrival: a burst's earlier requests (the chunked-prefill decoder) must
    # still run when the later ones arrive
    slow = axis in ("arrival", "chunked_prefill")
    data, code = _check(breaks, tmp_path / "c", 0.02 if slow else 0.003, expect="invariant")
    readings = _readings(data)
    assert readings[axis] == "breaks", readings
    others = {a: r for a, r in readings.items() if a != axis}
    if axis == "run_to_run":  # nothing can be told apart from run-to-run noise: the others say so, or hold
        assert set(others.values()) <= {"holds", "not_isolated"}, others
    else:
        assert set(others.values()) == {"holds"}, others
    assert code == 1 and axis in data["failed"]
    broken = next(a for a in data["axes"] if a["axis"] == axis)
    first = broken["first_break"]
    assert first["first_divergence"] is not None and first["flip_kind"] in ("tie", "near_tie")  # a flipped near-tie


def test_co_resident_names_the_size_where_it_first_breaks(tmp_path: Path) -> None:
    data, _ = _check(Breaks("co_resident", flip_at=4), tmp_path / "c")
    axis = next(a for a in data["axes"] if a["axis"] == "co_resident")
    assert axis["breaks_at"] == "n4"
    assert [lv["reading"] for lv in axis["levels"]] == ["holds", "breaks", "breaks"]  # n2 n4 n8


def test_the_sweep_stops_at_the_sequences_the_server_runs_at_once(tmp_path: Path) -> None:
    # a server that runs 4 sequences a step: 8 in flight would only queue 4 of them
    data, _ = _check(Breaks("co_resident", flip_at=4, max_num_seqs=4), tmp_path / "c")
    axis = next(a for a in data["axes"] if a["axis"] == "co_resident")
    assert [lv["level"] for lv in axis["levels"]] == ["n2", "n4"] and axis["breaks_at"] == "n4"
    assert data["sizes"] == [2, 4] and data["sizes_capped_at"] == 4
    assert "at most 4 sequences a step" in (tmp_path / "c" / "conformance.md").read_text()
    # a card without the limit (vLLM's) leaves the sweep to --max-batch
    assert ConformanceConfig("http://127.0.0.1:1", max_batch=64).sizes_for(None) == (2, 4, 8, 16, 32, 64)
    assert ConformanceConfig("http://127.0.0.1:1", max_batch=64).sizes_for(24) == (2, 4, 8, 16, 24)
    assert ConformanceConfig("http://127.0.0.1:1", max_batch=8).sizes_for(32) == (2, 4, 8)


def test_logprobs_that_move_without_a_token_read_tokens_hold(tmp_path: Path) -> None:
    data, _ = _check(Breaks("co_resident", flip_at=4, logprobs_only=True), tmp_path / "c")
    assert _readings(data)["co_resident"] == "tokens_hold"
    noise = ServerNoise.load(tmp_path / "c")
    assert noise.model(in_flight=2).changed == 0.0  # below 4 in flight nothing moved
    assert noise.model(in_flight=8).changed > 0.0


def test_expect_serial_gates_only_run_to_run(tmp_path: Path) -> None:
    _, code = _check(Breaks("co_resident"), tmp_path / "a", expect="serial")
    assert code == 0
    data, code = _check(Breaks("run_to_run"), tmp_path / "b", expect="serial")
    assert code == 1 and data["failed"] == ["run_to_run"]


def test_ctrl_c_exits_130_and_keeps_the_finished_units_as_a_probe_does(capsys, tmp_path: Path, monkeypatch) -> None:
    from flakecheck.probe.conformance import pipeline as check

    original = check.run_unit

    async def interrupt_at_arrival_middle(client, options, unit, vocab):
        if unit.name == "arrival.middle":
            raise KeyboardInterrupt
        return await original(client, options, unit, vocab)

    monkeypatch.setattr(check, "run_unit", interrupt_at_arrival_middle)
    out = tmp_path / "c"
    small = [a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    with ThreadedServer(make_breaking_app(Breaks(None))) as server:
        code, _, err = run_cli(capsys, "conformance", "--endpoint", server.url, "--out", out, "--quiet", *small)
    assert code == 130, err
    assert "interrupted" in err and "--resume" in err
    saved = {p.name for p in (out / "partial").glob("unit.*.json")}
    assert {"unit.reference.json", "unit.arrival.first.json"} <= saved and "unit.arrival.middle.json" not in saved
    assert not (out / "conformance.json").exists()


def test_a_failed_request_keeps_finished_units_and_resume_sends_only_the_rest(tmp_path: Path,
                                                                              monkeypatch) -> None:
    out = tmp_path / "c"
    monkeypatch.setenv("CONF_KEY", "sk-secret-123")
    breaks = Breaks(None, fail_salt="arrival.middle")
    with ThreadedServer(make_breaking_app(breaks)) as server:
        config = ConformanceConfig(server.url, out=out, retries=0, api_key_env="CONF_KEY", **SMALL)
        with pytest.raises(ConformanceFailed) as failed:
            conformance_check(config)
        message = str(failed.value)
        assert "arrival.middle" in message and "--resume" in message and "sk-secret" not in message
        saved = sorted(p.name for p in (out / "partial").glob("unit.*.json"))
        assert "unit.reference.json" in saved and "unit.arrival.first.json" in saved
        assert not (out / "conformance.json").exists()
        before = len(breaks.salts)
        breaks.fail_salt = None
        result = conformance_check(config, resume=True)
    assert result.exit_code == 0 and not (out / "partial").exists()
    resent = [salt for salt in breaks.salts[before:] if salt]
    assert any("arrival.middle" in salt for salt in resent)  # the failed unit is sent again, whole
    for unit in (f"{name}-" for name in [p.removeprefix("unit.").removesuffix(".json") for p in saved]):
        assert not any(unit in salt for salt in resent), unit  # a saved unit is not
    for path in out.rglob("*"):
        if path.is_file():
            assert b"sk-secret" not in path.read_bytes(), path


def test_bad_settings_and_a_missing_profile_are_refused() -> None:
    with pytest.raises(UserError, match="--expect"):
        ConformanceConfig("http://127.0.0.1:1", expect="bitwise")
    with pytest.raises(UserError, match="--max-batch"):
        ConformanceConfig("http://127.0.0.1:1", max_batch=1)
    with pytest.raises(UserError, match="noise.json"):
        ServerNoise.load(Path("/nonexistent"))


def test_the_markdown_table_names_every_axis_and_escapes_server_text(tmp_path: Path) -> None:
    data, _ = _check(Breaks("co_resident", flip_at=4), tmp_path / "c")
    text = (tmp_path / "c" / "conformance.md").read_text()
    for title in ("run to run", "co-resident sequences", "arrival position", "prefix cache", "chunked prefill",
                  "request shape"):
        assert f"| {title} |" in text
    assert "**breaks**" in text and "first at n4" in text
    assert json.loads((tmp_path / "c" / "conformance.json").read_text())["axes"] == data["axes"]


def test_the_command_exits_1_naming_the_axis_and_the_size(tmp_path: Path, capsys) -> None:
    with ThreadedServer(make_breaking_app(Breaks("co_resident", flip_at=4))) as server:
        code, out, _ = run_cli(capsys, "conformance", "--endpoint", server.url, "--expect", "invariant",
                               "--out", tmp_path / "c", "--markdown", tmp_path / "table.md", "--quiet",
                               *[a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))])
        assert code == 1
        assert "expected invariant: FAILED — co-resident sequences breaks at n4" in out
        assert (tmp_path / "table.md").read_text() == (tmp_path / "c" / "conformance.md").read_text()
        code, _, err = run_cli(capsys, "conformance", "--endpoint", server.url, "--expect", "bitwise")
        assert code == 2 and "--expect" in err


def test_the_suites_cases_are_targets_too(tmp_path: Path) -> None:
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"id": "chat-1", "input": [{"role": "system", "content": "Be brief."}, {"role": "user", '
                     '"content": "Name a river and a stone and a city."}], "max_tokens": 6}\n'
                     '{"id": "raw-1", "prompt": "A river, a stone, a city:", "max_tokens": 6}\n')
    data, code = _check(Breaks(None), tmp_path / "c", suite=suite, expect="invariant")
    assert code == 0 and data["targets"][-2:] == ["chat-1", "raw-1"]
    compared = {c["target"] for axis in data["axes"] for lv in axis["levels"] for c in lv["comparisons"]}
    assert {"chat-1", "raw-1"} <= compared


def test_the_command_lines_defaults_are_the_settings_defaults() -> None:
    import dataclasses

    import typer.main

    from flakecheck.cli import app

    command = typer.main.get_command(app).commands["conformance"]  # type: ignore[attr-defined]
    defaults = {f.name: f.default for f in dataclasses.fields(ConformanceConfig)
                if f.default is not dataclasses.MISSING}
    compared = [p.name for p in command.params if p.name in defaults]
    assert {"max_tokens", "targets", "max_batch", "burst", "chunk_budget", "seed", "retries"} <= set(compared)
    for param in command.params:
        if param.name in defaults:
            assert param.default == defaults[param.name], param.name
