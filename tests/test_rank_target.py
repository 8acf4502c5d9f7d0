"""The ranking's target for `run --sample auto`: the Spearman the observed rates are expected to reach against a
flat pass, checked against the Spearman flat passes then show on made-up flip probabilities."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import replace

import pytest

from flakecheck.analysis.flip.adaptive import AutoDraws, CaseDraws
from flakecheck.analysis.flip.calibration import spearman
from flakecheck.analysis.flip.rank_target import expected_spearman, prior, ranked_round

TARGET = AutoDraws(threshold=0.1, budget_rounds=2, max_rounds=8, rank_decided=True, rank_goal=0.91, budget_most=4)
GENERATORS: dict[str, Callable[[random.Random], float]] = {
    "even": lambda rng: rng.uniform(0.02, 0.95),
    "u-shaped": lambda rng: rng.betavariate(0.5, 0.5),
    "mostly low": lambda rng: rng.betavariate(0.7, 3.0),
}


def _cases(truth: list[float], draws: int, rng: random.Random) -> dict[str, CaseDraws]:
    return {f"c{i}": CaseDraws(draws, sum(rng.random() < p for _ in range(draws)), 0.2, draws // 4)
            for i, p in enumerate(truth)}


@pytest.mark.parametrize("generator", GENERATORS)
def test_the_expected_spearman_is_what_flat_passes_then_show(generator: str) -> None:
    expected, shown = [], []
    for seed in range(16):
        rng = random.Random(seed)
        truth = [GENERATORS[generator](rng) for _ in range(40)]
        cases = _cases(truth, 8, rng)
        observed = [cases[f"c{i}"].flips / 8 for i in range(len(truth))]
        flat_passes = [[sum(rng.random() < p for _ in range(32)) / 32 for p in truth] for _ in range(12)]
        value = expected_spearman(cases, TARGET, 32)
        assert value is not None
        expected.append(value)
        shown.append(statistics.mean(v for v in (spearman(observed, f) for f in flat_passes) if v is not None))
    bias = statistics.mean(e - s for e, s in zip(expected, shown))
    assert -0.04 <= bias <= 0.02, (generator, bias)  # on average within a few hundredths, if anything low
    # one suite's expectation misses by more, its 40 cases' own draws deciding (0.02-0.08 on average here)
    assert statistics.mean(abs(e - s) for e, s in zip(expected, shown)) <= 0.08


def test_more_draws_are_expected_to_rank_better_and_stopped_cases_count_as_the_rule_stopped_them() -> None:
    rng = random.Random(5)
    truth = [rng.uniform(0.02, 0.95) for _ in range(40)]
    few, many = _cases(truth, 4, random.Random(1)), _cases(truth, 32, random.Random(1))
    assert expected_spearman(few, TARGET, 32) < expected_spearman(many, TARGET, 32)
    # a case that cannot flip is 0 in every flat pass: the ranks of 0 and of flipping cases are then certain
    settled = {f"s{i}": CaseDraws(4, 0, 0.0, 1) for i in range(10)} | {"a": CaseDraws(32, 30, 0.5, 8)}
    assert expected_spearman(settled, TARGET, 32) == pytest.approx(1.0)
    assert expected_spearman({"one": CaseDraws(4, 1, 0.2, 1)}, TARGET, 32) is None


def test_the_prior_is_the_one_the_counts_came_from() -> None:
    rng = random.Random(3)
    counts = []
    for _ in range(300):
        p = rng.betavariate(2.0, 6.0)  # mean 0.25
        counts.append((sum(rng.random() < p for _ in range(8)), 8))
    a, b = prior(counts)
    assert a / (a + b) == pytest.approx(0.25, abs=0.05) and 2 <= a + b <= 16
    assert prior([(1, 4)]) == (0.5, 0.5)


def test_the_budget_grows_a_round_at_a_time_only_while_the_ranking_falls_short() -> None:
    rng = random.Random(9)
    truth = [rng.uniform(0.05, 0.95) for _ in range(20)]
    cases = {c: CaseDraws(s.draws, s.flips, 0.2, 2) for c, s in _cases(truth, 8, rng).items()}  # 2 rounds each
    spent = 2.0 * len(cases)  # the budget of 2 rounds a case is spent
    chosen, budget, judged = ranked_round(cases, TARGET, 2.0, spent, None, 2, 32)
    assert judged is not None and judged < TARGET.rank_goal
    assert budget == 3.0 and len(chosen) == len(cases) // 2  # one round a case more: half the cases, 2 rounds each
    # the same cases without a goal, or with the budget at its most: nothing more
    assert ranked_round(cases, replace(TARGET, rank_goal=None), 2.0, spent, None, 2, 32) == ([], 2.0, None)
    assert ranked_round(cases, TARGET, 4.0, 4.0 * len(cases), None, 2, 32) == ([], 4.0, None)
    # while the budget still pays for a replay, the ranking is not asked
    assert ranked_round(cases, TARGET, 2.0, 1.0 * len(cases), None, 2, 32)[2] is None
    # every case settled at 0 or certain: expected to rank at the goal, so the budget stays
    settled = {f"s{i}": CaseDraws(4, 0, 0.0, 1) for i in range(10)} | {"a": CaseDraws(32, 30, 0.5, 8)}
    assert ranked_round(settled, TARGET, 2.0, 22.0, None, 2, 32) == ([], 2.0, pytest.approx(1.0))
