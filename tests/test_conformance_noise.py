"""Predictions from the server's own noise: a conformance check's profile (`noise.json`) given to a serial
probe (`--noise DIR`) predicts 0 for every case of a server that moves nothing, and more than 0 for the cases
with near-ties of a server whose numbers move under load — only for the load that moves them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakecheck.errors import UserError
from flakecheck.probe import ProbeConfig, probe_suite
from flakecheck.probe.conformance import ConformanceConfig, conformance_check
from flakecheck.probe.conformance.noise import LevelNoise, ServerNoise
from flakecheck.reports.flip_view import prediction_note
from tests.conformance_fakes import Breaks, make_breaking_app
from tests.probe_fakes import ThreadedServer

SMALL = {"targets": 2, "max_tokens": 8, "max_batch": 8, "burst": 6, "chunk_budget": 80}


@pytest.fixture()
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.jsonl"
    words = "river stone light paper city music table winter forest number letter story bridge market".split()
    path.write_text("".join(json.dumps({"id": f"c{i}", "prompt": " ".join(words[i:] + words[:i]), "max_tokens": 12})
                            + "\n" for i in range(8)))
    return path


def _profile_and_serial_probe(breaks: Breaks, tmp_path: Path, suite: Path, **noise) -> tuple[list, dict]:
    with ThreadedServer(make_breaking_app(breaks)) as server:
        conformance_check(ConformanceConfig(server.url, out=tmp_path / "conformance", **SMALL))
        run = probe_suite(ProbeConfig(suite, server.url, concurrency=(1,), out=tmp_path / "probe", html=False,
                                      noise=tmp_path / "conformance", **noise))
    return list(run.cases["p_flip_pred"]), run.record.flip or {}


def test_a_server_that_moves_nothing_is_predicted_to_flip_nothing(tmp_path: Path, suite: Path) -> None:
    predicted, flip = _profile_and_serial_probe(Breaks(None), tmp_path, suite)
    assert predicted == [0.0] * 8  # not "fragile": this server cannot flip them
    assert flip["noise_source"]["source"] == "server" and flip["noise"]["n_shifts"] > 0
    assert "the server's own noise" in (prediction_note(flip) or "")


def test_a_server_whose_numbers_move_under_load_is_predicted_to_flip_under_that_load(tmp_path: Path,
                                                                                     suite: Path) -> None:
    breaks = Breaks("co_resident", flip_at=4, logprobs_only=True)
    predicted, flip = _profile_and_serial_probe(breaks, tmp_path / "a", suite)
    assert any(p > 0 for p in predicted) and all(0 <= p < 1 for p in predicted)
    assert flip["noise_source"]["levels"] == ["co_resident.n8"]  # no load given: the largest measured
    light, flip = _profile_and_serial_probe(breaks, tmp_path / "b", suite, noise_in_flight=2)
    assert light == [0.0] * 8  # up to 2 in flight this server moved nothing
    assert flip["noise_source"]["in_flight"] == 2


def test_a_load_is_predicted_from_the_level_measured_at_that_load_not_a_pool_diluted_by_serial_zeros() -> None:
    levels = (LevelNoise("run_to_run", "serial", 1, (0.0,) * 90),
              LevelNoise("co_resident", "n2", 2, (0.0,) * 30),
              LevelNoise("co_resident", "n8", 8, (0.0,) * 2 + (0.125,) * 8),
              LevelNoise("arrival", "middle", 8, (0.0,) * 10),
              LevelNoise("prefix_cache", "warm", 1, (0.0,) * 10))
    noise = ServerNoise("logprob", "bfloat16", levels)
    assert noise.model(8).changed == 0.8  # the 8-in-flight draws' own noise, whatever else the check sent
    assert noise.model(12).shifts == noise.model(8).shifts  # the largest size measured under the load
    assert noise.model(4).changed == 0.0 and noise.model(1).changed == 0.0
    assert noise.model(None).changed == 0.8
    assert noise.model(8, prefix=True).changed == 0.4  # the probe's prefix level: its warm shifts join
    assert [f"{lv.axis}.{lv.level}" for lv in noise.used_levels(3, False)] == ["co_resident.n2"]


def test_a_bad_noise_directory_is_refused_before_anything_is_written(tmp_path: Path, suite: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "noise.json").write_text('{"unit": "logprob"}')
    with pytest.raises(UserError, match="noise.json"):
        probe_suite(ProbeConfig(suite, "http://127.0.0.1:9", concurrency=(1,), out=tmp_path / "p", noise=bad))
    assert not (tmp_path / "p").exists()
    with pytest.raises(UserError, match="--noise-in-flight needs --noise"):
        ProbeConfig(suite, "http://127.0.0.1:9", noise_in_flight=4)


def test_a_simulation_says_its_predictions_describe_the_profile_not_the_server() -> None:
    note = prediction_note({"noise": {"n_shifts": 10, "changed": 0.5},
                            "noise_source": {"source": "simulation", "profile": "h100", "policy": "splitk"}})
    assert note is not None and "simulated h100 profile" in note and "not your server" in note
