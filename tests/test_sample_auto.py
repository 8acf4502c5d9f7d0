"""`run --sample auto` (issue 39): the draws in rounds, the cases no longer measured kept in their batches as
shape-only requests of their reference's length, so the measured cases get the tokens the full draw gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

import flakecheck
from flakecheck.analysis.flip.server_load import parse_load, sample_compositions
from flakecheck.data.compositions import Composition
from flakecheck.engine import LoadedModel, load_model
from flakecheck.errors import UserError
from flakecheck.replay import CaseRequest, FillerId, build_requests
from flakecheck.reports.terminal import render_summary
from flakecheck.run.settings import DRAWS_PER_ROUND, ROUNDS_PER_REPLAY, RunConfig, parse_sample
from tests.test_run import write_suite


def test_a_shape_only_case_keeps_its_place_its_prompt_and_the_given_length() -> None:
    cases = [CaseRequest(f"c{i}", [5 + i] * (3 + i), 10) for i in range(5)]
    full = Composition("d", max_batch=4, order_seed=7)
    shaped = Composition("d", max_batch=4, order_seed=7, shape_only=(("c1", 6), ("c3", 2)))
    before, after = build_requests(cases, full, 0, 100, frozenset()), build_requests(cases, shaped, 0, 100, frozenset())
    assert len(before) == len(after)
    for a, b in zip(before, after):
        assert a.prompt_ids == b.prompt_ids and a.arrival == b.arrival
        if a.request_id in ("c1", "c3"):
            assert isinstance(b.request_id, FillerId) and b.params.ignore_eos
            assert b.params.max_tokens == {"c1": 6, "c3": 2}[a.request_id]
        else:
            assert b == a
    assert shaped.measured([c.case_id for c in cases]) == ["c0", "c2", "c4"]
    assert "shape_only" not in shaped.to_dict()  # a round's detail, never recorded as the composition


def test_sample_is_parsed_once_at_the_door() -> None:
    most, target = parse_sample("auto")
    assert target is not None and most == target.max_rounds * DRAWS_PER_ROUND == 32  # a flat --sample 32's
    assert sum(ROUNDS_PER_REPLAY) == target.max_rounds and ROUNDS_PER_REPLAY[0] == 1  # every round, the first alone
    assert target.rarely_flips and target.rank_decided  # the simulation's prediction, and ranking what flips
    assert parse_sample("12") == (12, None) and parse_sample(3) == (3, None)
    # auto:N: N draws a case on average, the budget the rule spends; a plain `auto` is auto:8, recorded as `auto`
    assert parse_sample("auto:8") == parse_sample("auto") and target.budget_rounds * DRAWS_PER_ROUND == 8
    most, twelve = parse_sample(" AUTO:12 ")
    assert most == 32 and twelve is not None and twelve.budget_rounds * DRAWS_PER_ROUND == 12
    assert (target.spec, twelve.spec) == ("auto", "auto:12")
    assert RunConfig.parse("s.jsonl", sample="auto:12").to_dict()["sample"] == "auto:12"
    assert RunConfig.parse("s.jsonl", sample="auto").to_dict()["sample"] == "auto"
    for bad in ("lots", "auto:3", "auto:33", "auto:", "auto:ten", "auto:-8"):
        with pytest.raises(UserError, match="--sample"):
            parse_sample(bad)
    with pytest.raises(UserError, match="--sample auto"):
        RunConfig.parse("s.jsonl", sample="auto", repeat=2)


@pytest.fixture(scope="module")
def tiny(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def test_sample_auto_measures_the_undecided_cases_in_the_batches_the_full_draw_makes(tiny, tmp_path) -> None:
    suite = write_suite(tmp_path / "s.jsonl")
    common = {"model": tiny, "kernels": "splitk", "max_tokens": 10, "html": False, "limit": 8,
              "compositions": [Composition("solo")], "load": "poisson:6", "sample_seed": 3}
    auto = flakecheck.run_suite(suite, out=tmp_path / "auto", sample="auto", **common)
    adaptive = auto.meta["adaptive"]
    ran = adaptive["draws_run"]
    assert auto.meta["flip"]["draws"] == ran and len(ran) % DRAWS_PER_ROUND == 0 and len(ran) > DRAWS_PER_ROUND
    assert adaptive["budget_spent"] <= adaptive["target"]["budget_rounds"]  # each round at its case's cost
    replays = adaptive["replays"]  # what each replay measured and cost, adding up to the run's
    bounds = [DRAWS_PER_ROUND * sum(ROUNDS_PER_REPLAY[:i]) for i in range(len(replays) + 1)]
    assert [r["draws"] for r in replays] == [ran[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    assert bounds[-1] == len(ran)
    assert len(replays) > 1 and len(replays[1]["draws"]) == DRAWS_PER_ROUND * ROUNDS_PER_REPLAY[1]
    assert replays[0]["cases"] == 8
    assert sum(r["cases"] * len(r["draws"]) for r in replays) == DRAWS_PER_ROUND * adaptive["case_rounds"]
    assert sum(r["rows"] for r in replays) == auto.meta["replay_stats"]["rows"]
    runs = auto.runs
    for row in auto.cases.itertuples():
        drawn = runs[(runs.case_id == row.case_id) & runs.composition.isin(ran)]
        info = adaptive["cases"][row.case_id]
        assert row.n_draws == len(drawn) == info["draws"] == DRAWS_PER_ROUND * info["rounds"]
    measured_later = [c for c, info in adaptive["cases"].items() if info["rounds"] > 1]
    stopped = [c for c, info in adaptive["cases"].items() if info["rounds"] == 1]
    assert measured_later and stopped  # the test means something only if some rounds left cases out
    assert auto.meta["replay_stats"]["skipped_rows"] > 0
    console = Console(record=True, width=240)
    render_summary(auto, console, top=3)
    fewest, most = min(auto.cases.n_draws), max(auto.cases.n_draws)
    assert f"{len(ran)} compositions sampled from poisson:6 (seed 3; {fewest}–{most} a case" in console.export_text()
    # the second replay's draws replayed flat, every case measured: the cases auto still measured got the same
    # tokens wherever the cases it left out kept their reference's length (they stand in at that length)
    second = sample_compositions(parse_load("poisson:6"), bounds[2], 3)[bounds[1]:]
    flat = flakecheck.run_suite(suite, out=tmp_path / "flat", **{**common, "compositions": [Composition("solo"),
                                                                                           *second]})
    ref = {r.case_id: list(r.token_ids) for r in flat.runs[flat.runs.composition == "solo"].itertuples()}
    compared = 0
    for draw in [d.name for d in second]:
        full = {r.case_id: list(r.token_ids) for r in flat.runs[flat.runs.composition == draw].itertuples()}
        mine = {r.case_id: list(r.token_ids) for r in runs[runs.composition == draw].itertuples()}
        left_out = [c for c in full if c not in mine]
        if any(len(full[c]) != len(ref[c]) for c in left_out):
            continue
        for case, tokens in mine.items():
            assert tokens == full[case], (draw, case)
            compared += 1
    assert compared > 0


@pytest.mark.parametrize("args", [["--sample", "lots"], ["--sample", "auto", "--repeat", "2"],
                                  ["--sample", "auto:2"]])
def test_a_bad_sample_on_the_command_line_exits_2_naming_it(args, tmp_path, capfd) -> None:
    from tests.test_run import run_cli

    out = tmp_path / "out"
    code, text = run_cli(["run", str(write_suite(tmp_path / "s.jsonl")), "--out", str(out), *args], capfd)
    assert code == 2 and "--sample" in text and not out.exists()
