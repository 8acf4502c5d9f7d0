"""`probe --repeat auto` (issue 39): rounds only while a case's flip probability is undecided, against a
fake server whose per-case flip probabilities are known; and the stopping rule's intervals, run against a
fake draw source, still cover those probabilities at their stated level."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from flakecheck.analysis.flip.adaptive import AutoDraws, CaseDraws, measure, next_round, rare_below, stop_reason
from flakecheck.analysis.flip.observed import LEVEL, exact_interval
from flakecheck.errors import UserError
from flakecheck.probe import ProbeConfig, probe_suite
from flakecheck.probe.settings import parse_repeat
from flakecheck.reports.facts import gather
from flakecheck.reports.flip_view import fmt_observed
from flakecheck.reports.json_report import render_json
from flakecheck.reports.markdown import render_markdown
from flakecheck.reports.terminal import render_summary
from tests.probe_fakes import Behaviour, Record, ThreadedServer, make_app

CHANCES = [0.0] * 6 + [0.05, 0.2, 0.5, 0.8, 1.0, 1.0]


def test_stopping_on_the_interval_keeps_its_coverage_on_a_fake_draw_source() -> None:
    """Known flip probabilities, a fixed seed: after the rounds stop, each interval still holds its case's
    probability at the stated level (over the repetitions, for each probability strictly between 0 and 1,
    where an interval can miss), and the rounds stay within the budget."""
    rng = random.Random(3939)
    target = AutoDraws()
    rates = [0.0, 0.01, 0.05, 0.1, 0.15, 0.3, 0.5, 0.7, 0.9, 1.0]
    truth = {f"c{i}": p for i, p in enumerate(rates * 3)}
    predicted = {c: (0.0 if p == 0 else 0.2) for c, p in truth.items()}
    covered = {p: 0 for p in rates}
    repetitions = 100
    for _ in range(repetitions):
        result = measure(list(truth), lambda c: rng.random() < truth[c], predicted, target)
        assert sum(s.rounds for s in result.values()) <= target.budget_rounds * len(truth)
        assert all(1 <= s.rounds <= target.max_rounds for s in result.values())
        for c, s in result.items():
            low, high = exact_interval(s.flips, s.draws)
            covered[truth[c]] += low <= truth[c] <= high
    inner = [p for p in rates if 0 < p < 1]
    assert sum(covered[p] for p in inner) / (3 * repetitions * len(inner)) >= LEVEL
    # each rate alone: 300 intervals, so a true 95% would fall below 92.5% about once in 100 seeds
    assert all(covered[p] / (3 * repetitions) >= 0.925 for p in inner), covered


def test_the_rules_stop_what_is_decided_and_spend_the_rest_where_intervals_are_widest() -> None:
    target = AutoDraws(threshold=0.1, budget_rounds=3, max_rounds=8)
    assert stop_reason(CaseDraws(1, 0, 0.0, 1), target) == "cannot flip"
    assert stop_reason(CaseDraws(1, 0, 0.2, 1), target) is None  # the noise says it could: keep drawing
    # predicted below 8.3%: a flat --repeat 8 more likely sees no flip than one, so "not flipped" stands
    simulated = replace(target, rarely_flips=True)
    assert stop_reason(CaseDraws(1, 0, 0.05, 1), simulated) == "rarely flips"
    assert stop_reason(CaseDraws(4, 0, 0.05, 1), simulated) is None  # 4 draws a round: it stands in for 32
    assert stop_reason(CaseDraws(4, 1, 0.05, 1), simulated) is None  # a flip seen outweighs the prediction
    assert stop_reason(CaseDraws(1, 0, 0.05, 1), target) is None  # a server's prediction does not rank flips
    assert stop_reason(CaseDraws(2, 2, 0.2, 2), target) == "above"  # [0.16, 1]
    assert stop_reason(CaseDraws(8, 0, 0.2, 8), target) == "cap"
    cases = {"stable": CaseDraws(1, 0, 0.0, 1), "open": CaseDraws(2, 1, 0.2, 2), "zero": CaseDraws(2, 0, 0.2, 2),
             "high": CaseDraws(2, 2, 0.2, 2)}
    assert next_round(cases, target, rounds_spent=7) == ["open", "zero"]  # the undecided ones
    # one left: the case with no flip yet, whose flipped-or-not decision is still open
    assert next_round(cases, target, rounds_spent=11) == ["zero"]
    flipped = {"narrow": CaseDraws(8, 2, 0.2, 7), "wide": CaseDraws(2, 1, 0.2, 2), "done": CaseDraws(1, 0, 0.0, 1)}
    assert next_round(flipped, target, rounds_spent=8) == ["wide"]  # then the widest interval
    decided = {**cases, "open": CaseDraws(3, 3, 0.2, 3), "zero": CaseDraws(8, 0, 0.2, 8)}
    assert next_round(decided, target, rounds_spent=10) == ["open", "high"]  # the budget left: ranked cases
    assert next_round(decided, target, rounds_spent=12) == []


def test_ranking_the_decided_cases_lets_them_compete_for_each_round() -> None:
    target = AutoDraws(threshold=0.1, budget_rounds=3, max_rounds=8)
    ranked = replace(target, rank_decided=True)
    cases = {"stable": CaseDraws(1, 0, 0.0, 1), "open": CaseDraws(2, 1, 0.2, 2), "zero": CaseDraws(2, 0, 0.2, 2),
             "high": CaseDraws(2, 2, 0.2, 2)}  # high: [0.16, 1], decided above 10%
    assert stop_reason(cases["high"], target) == "above"
    # budget 12, 5 left: the undecided alone, or every case that can still flip
    assert next_round(cases, target, rounds_spent=7) == ["open", "zero"]
    assert next_round(cases, ranked, rounds_spent=7) == ["open", "zero", "high"]
    # 2 left: the case with no flip yet first either way, then the widest: open [0.01, 0.99] before high
    assert next_round(cases, ranked, rounds_spent=10) == ["open", "zero"]
    # a decided case with a wider interval goes before an undecided one that has flipped
    pair = {"undecided": CaseDraws(8, 2, 0.2, 2), "decided": CaseDraws(2, 2, 0.2, 1)}  # [0.03, 0.65], [0.16, 1]
    assert stop_reason(pair["undecided"], target) is None and stop_reason(pair["decided"], target) == "above"
    assert next_round(pair, ranked, rounds_spent=5) == ["decided"]
    assert next_round(pair, target, rounds_spent=5) == ["undecided"]


def test_the_budget_counts_each_round_at_its_cases_cost() -> None:
    target = AutoDraws(threshold=0.1, budget_rounds=2, max_rounds=8)
    cases = {"long": CaseDraws(1, 0, 0.2, 1), "short": CaseDraws(1, 0, 0.2, 1)}
    cost = {"long": 1.5, "short": 0.5}  # budget: 2 rounds of the average case each, 4 in all
    assert next_round(cases, target, rounds_spent=2.0, cost=cost) == ["long", "short"]
    assert next_round(cases, target, rounds_spent=2.6, cost=cost) == ["short"]  # 1.4 left: the long one waits
    assert next_round(cases, target, rounds_spent=3.6, cost=cost) == []
    assert next_round(cases, target, rounds_spent=2.6) == ["long"]  # unweighted: 1.4 rounds left pay one


def test_a_replay_of_several_rounds_charges_each_case_all_of_them() -> None:
    target = AutoDraws(threshold=0.1, budget_rounds=2, max_rounds=4)
    cases = {"a": CaseDraws(1, 0, 0.2, 1), "b": CaseDraws(1, 0, 0.2, 1), "c": CaseDraws(1, 0, 0.2, 1)}
    # budget 6, 3 spent: one round each for all three, or two rounds for one of them
    assert next_round(cases, target, rounds_spent=3) == ["a", "b", "c"]
    assert next_round(cases, target, rounds_spent=3, size=2) == ["a"]
    assert next_round(cases, target, rounds_spent=2, size=2) == ["a", "b"]
    # a replay that would take a case past max_rounds passes it over, however much budget is left
    late = {**cases, "a": CaseDraws(3, 0, 0.2, 3)}
    assert next_round(late, target, rounds_spent=0, size=2) == ["b", "c"]


@pytest.mark.parametrize("flat_draws", [1, 8, 32])
def test_a_flat_pass_sees_a_flip_half_the_time_at_the_rarely_flips_line(flat_draws: int) -> None:
    line = rare_below(flat_draws)
    assert (1 - line) ** flat_draws == pytest.approx(0.5)
    assert (1 - line * 0.9) ** flat_draws > 0.5 > (1 - line * 1.1) ** flat_draws


@pytest.mark.parametrize("text, expected", [("auto", (8, AutoDraws())), ("3", (3, None)), (" AUTO ", (8, AutoDraws()))])
def test_repeat_is_parsed_once_at_the_door(text, expected) -> None:
    assert parse_repeat(text) == expected


def test_a_probe_records_its_target_as_before_the_simulations_ranking_settings() -> None:
    # the fingerprint a resumed probe must match holds this record: a directory from before still resumes
    assert set(AutoDraws().to_dict()) == {"threshold", "budget_rounds", "max_rounds", "rarely_flips"}
    ranked = AutoDraws(rank_decided=True, rank_goal=0.9, budget_most=6).to_dict()
    assert (ranked["rank_decided"], ranked["rank_goal"], ranked["budget_most"]) == (True, 0.9, 6)


def test_a_bad_repeat_names_the_flag() -> None:
    with pytest.raises(UserError, match="--repeat"):
        parse_repeat("often")


def _suite(path: Path) -> Path:
    lines = [json.dumps({"id": f"k{i}", "prompt": f"Case {i}: chance={p} go", "max_tokens": 4})
             for i, p in enumerate(CHANCES)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_repeat_auto_against_a_server_with_known_flip_probabilities(tmp_path: Path) -> None:
    behaviour, record = Behaviour(chances=random.Random(7), step_delay_s=0.001), Record()
    suite = _suite(tmp_path / "s.jsonl")
    with ThreadedServer(make_app(behaviour, record)) as server:
        run = probe_suite(ProbeConfig(suite, server.url, out=tmp_path / "auto", html=True, concurrency=(1, 8),
                                      auto=AutoDraws()))
    adaptive = run.meta["adaptive"]
    assert run.meta["config"]["auto"] == AutoDraws().to_dict()
    cases = run.cases.set_index("case_id")
    for i, p in enumerate(CHANCES):
        row, info = cases.loc[f"k{i}"], adaptive["cases"][f"k{i}"]
        drawn = run.runs[(run.runs.case_id == f"k{i}") & (run.runs.composition == "c8")]
        assert row.n_draws == len(drawn) == info["draws"] == info["rounds"]
        if p == 0:  # no gap the measured noise can close: one round, never flipped
            assert info == {"rounds": 1, "draws": 1, "stopped": "cannot flip"} and row.p_flip == 0
        if p == 1.0:
            assert row.p_flip == 1.0 and row.p_flip_low > 0.1
    # the budget: 4 rounds a case on average, so at most half the case-requests of --repeat 8
    assert adaptive["case_rounds"] <= 4 * len(CHANCES) < adaptive["flat_case_rounds"]
    assert (run.runs.composition == "c1").sum() == len(CHANCES)  # the serial reference once
    # the cases still measured met as many requests in flight as the first round (fillers in their place)
    assert record.max_in_flight >= 8
    later = [label for label in run.meta["server"]["levels"] if label.startswith("c8 #")]
    assert later and all(run.meta["server"]["levels"][label]["fillers_sent"] > 0 for label in later)
    # every report shows each case's interval and its own number of draws
    shown = gather(run).top(10)
    assert len({c["n_draws"] for c in shown}) > 1
    markdown, html = render_markdown(run), (run.path / "report.html").read_text()
    console = Console(record=True, width=240)
    render_summary(run, console, top=10)
    terminal = console.export_text()
    for case in shown:
        text = fmt_observed(case)
        assert text.endswith(f" n={case['n_draws']}") and all(text in r for r in (markdown, html, terminal))
    assert [c["n_draws"] for c in json.loads(render_json(run))["top"]] == [c["n_draws"] for c in shown]


@pytest.mark.parametrize("args", [["--repeat", "often"], ["--repeat", "0"], ["--repeat", "-2"],
                                  ["--repeat", "auto", "--concurrency", "1"]])
def test_a_bad_repeat_on_the_command_line_exits_2_before_asking_the_server(args, tmp_path, capfd) -> None:
    from tests.test_run import run_cli

    out = tmp_path / "out"
    code, text = run_cli(["probe", str(_suite(tmp_path / "s.jsonl")), "--endpoint", "http://127.0.0.1:9",
                          *args, "--out", str(out)], capfd)
    assert code == 2 and "--repeat" in text and not out.exists()
