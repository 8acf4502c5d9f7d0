"""How well the observed flip rates so far would rank the cases against a flat pass: the ranking's target for
`run --sample auto`.

Where most cases flip, the flipped-or-not decisions are settled after a few draws but the rates are not: a
case stopped "above 10%" after 4 draws has a rate in quarters, and 30-odd such cases rank by noise. Before each
later replay, once the budget is spent, the run asks how well its observed rates would agree in rank
(Spearman) with a flat pass of `flat_draws` draws, and grows the budget one round a case at a time while the
answer is below `AutoDraws.rank_goal`, up to `AutoDraws.budget_most`.

The answer is an expectation over what the cases' flip probabilities could be given their draws: 0 for a case
that cannot flip and its prediction for one that rarely flips (what the rule stopped it on), and for every other
case a draw from its posterior, Beta(flips + a, draws − flips + b), under the prior Beta(a, b) that makes the
suite's own counts likeliest (beta-binomial, over a grid of means and concentrations: empirical Bayes, so a
suite where rates spread evenly and one where they crowd at 0 and 1 each get their own); for each of `samples`
such draws of every case, a flat pass's rates (binomial over `flat_draws`) against the observed rates. On
made-up rates of 40 cases (tests/test_rank_target.py) the expectation is on average within 0.035 of the
Spearman flat passes then show, one suite's within 0.02-0.08; on a real suite where 36-38 of 40 cases flip it
ran 0.03-0.07 above what the flat passes of another seed showed (docs/flip-probability.md). The seed is
fixed, so a resumed run decides the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from flakecheck.analysis.flip.adaptive import AutoDraws, CaseDraws, next_round, stop_reason
from flakecheck.analysis.flip.calibration import spearman

SAMPLES = 256
PRIOR_MEANS = tuple(i / 20 for i in range(1, 20))
PRIOR_CONCENTRATIONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def prior(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """The Beta(a, b) prior under which the (flips, draws) counts are likeliest (Jeffreys' ½, ½ for fewer than
    two counts)."""
    if len(counts) < 2:
        return 0.5, 0.5

    def likelihood(a: float, b: float) -> float:  # the beta-binomial's, less the binomial coefficients
        return sum(math.lgamma(k + a) + math.lgamma(n - k + b) - math.lgamma(n + a + b) for k, n in counts) \
            + len(counts) * (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))

    mean, concentration = max(((m, c) for m in PRIOR_MEANS for c in PRIOR_CONCENTRATIONS),
                              key=lambda mc: likelihood(mc[0] * mc[1], (1 - mc[0]) * mc[1]))
    return mean * concentration, (1 - mean) * concentration


def expected_spearman(cases: Mapping[str, CaseDraws], target: AutoDraws, flat_draws: int,
                      samples: int = SAMPLES, seed: int = 0) -> float | None:
    """The expected Spearman correlation of the cases' observed rates with a flat pass of `flat_draws` draws
    (None: fewer than 2 cases with draws, or no sample with ranks on both sides)."""
    ids = [c for c in cases if cases[c].draws]
    if len(ids) < 2:
        return None
    rng = np.random.default_rng(seed)
    why = {c: stop_reason(cases[c], target) for c in ids}
    a, b = prior([(cases[c].flips, cases[c].draws) for c in ids if why[c] not in ("cannot flip", "rarely flips")])
    truth = np.empty((samples, len(ids)))
    for j, case in enumerate(ids):
        s = cases[case]
        if why[case] == "cannot flip":
            truth[:, j] = 0.0
        elif why[case] == "rarely flips":
            truth[:, j] = s.predicted or 0.0
        else:
            truth[:, j] = rng.beta(s.flips + a, s.draws - s.flips + b, samples)
    observed = [cases[c].flips / cases[c].draws for c in ids]
    flat = rng.binomial(flat_draws, truth) / flat_draws
    values = [v for v in (spearman(observed, list(row)) for row in flat) if v is not None]
    return sum(values) / len(values) if values else None


def ranked_round(cases: Mapping[str, CaseDraws], target: AutoDraws, budget: float, rounds_spent: float,
                 cost: Mapping[str, float] | None, size: int, flat_draws: int
                 ) -> tuple[list[str], float, float | None]:
    """`next_round` at `budget` rounds a case; when it chooses no case and the target has a `rank_goal` the
    observed rates are not expected to reach, the budget grown one round a case at a time (up to
    `budget_most`) until it chooses some. Returns the cases, the budget now, and the expected Spearman it
    judged by (None where it did not ask)."""
    chosen = next_round(cases, replace(target, budget_rounds=budget), rounds_spent, cost, size)
    most = target.budget_most
    if chosen or target.rank_goal is None or most is None or budget >= most:
        return chosen, budget, None
    expected = expected_spearman(cases, target, flat_draws)
    while not chosen and expected is not None and expected < target.rank_goal and budget < most:
        budget = min(most, budget + 1.0)
        chosen = next_round(cases, replace(target, budget_rounds=budget), rounds_spent, cost, size)
    return chosen, budget, expected
