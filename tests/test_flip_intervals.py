"""Honest flip-probability intervals (issue 39): the exact interval's coverage is at least its stated level for
every true probability and number of draws, and the intervals a run writes to cases.parquet cover the known
flip probabilities of a fake draw source at that level."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from flakecheck.analysis.flip.observed import LEVEL, exact_interval
from tests.run_builder import CaseSpec, RunSpec, write_run


def coverage(p: float, n: int) -> float:
    """The exact probability that the interval of Binomial(n, p) flips contains p (no simulation)."""
    intervals = [exact_interval(k, n) for k in range(n + 1)]
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k)
               for k, (low, high) in enumerate(intervals) if low <= p <= high)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 32])
def test_the_interval_covers_every_true_probability_at_its_stated_level(n: int) -> None:
    # a grid that includes the rates at the ends, where approximate intervals fail
    for p in [0.001, 0.005, 0.01, 0.02, *(i / 50 for i in range(2, 49)), 0.98, 0.99, 0.995, 0.999]:
        assert coverage(p, n) >= LEVEL - 1e-9, (p, n, coverage(p, n))


def test_the_interval_at_the_ends_and_inside() -> None:
    assert exact_interval(0, 0) == (0.0, 1.0)
    assert exact_interval(0, 8)[0] == 0.0 and exact_interval(8, 8)[1] == 1.0
    # 0 flips of n: the upper bound solves (1 - p)^n = 2.5%
    assert exact_interval(0, 8)[1] == pytest.approx(1 - 0.025 ** (1 / 8), abs=1e-9)
    for k, n in ((1, 8), (4, 8), (7, 8), (3, 32)):
        low, high = exact_interval(k, n)
        assert low < k / n < high
        assert exact_interval(k, 2 * n)[1] - exact_interval(k, 2 * n)[0] < high - low or k == 0


def test_a_runs_intervals_cover_a_fake_draw_sources_known_flip_probabilities(tmp_path: Path) -> None:
    """A fake source whose cases flip with known probabilities, drawn with a fixed seed: the intervals the run
    writes to cases.parquet (through the writer every run ends with) cover them at about the stated level."""
    rng = random.Random(39)
    draws = [f"d{i}" for i in range(1, 13)]
    truth, specs = {}, []
    for i in range(120):
        p = rng.choice([0.0, 0.02, 0.1, 0.25, 0.5, 0.8, 1.0])
        outputs = [[3, 4]] + [[3, 5] if rng.random() < p else [3, 4] for _ in draws]
        truth[f"case-{i}"] = p
        specs.append(CaseSpec(f"case-{i}", None, outputs, [1.0, 1.0]))
    run = write_run(tmp_path / "run", RunSpec(["solo", *draws], specs, draws=draws))
    assert run.meta["flip"]["interval"] == {"method": "clopper-pearson", "level": LEVEL}
    covered = 0
    for row in run.cases.itertuples():
        assert row.n_draws == len(draws)
        covered += row.p_flip_low <= truth[row.case_id] <= row.p_flip_high
    # at least 95% in expectation; 108 of 120 leaves room for the binomial spread of one fixed seed
    assert covered >= 108, covered
