"""Observed flip probability: per case, the share of sampled compositions (draws) whose tokens, and whose
verdict, differ from the reference's, with 95% Wilson score intervals; per suite, the total agreement rates
TARr@N (every draw's raw output identical) and TARa@N (every draw's verdict identical).

The Wilson interval keeps its nominal coverage at the extremes where the normal approximation collapses to a
zero-width interval (0 of 32 flips still leaves an upper bound of 0.107), which is where most cases sit. One
known weak spot remains: with 1–3 flips its lower bound overshoots a small true rate (1 of 8 gives 0.022, so
a case that flips 2% of the time is missed 15% of the times it flips once). Following Brown, Cai and DasGupta
(2001, "Interval estimation for a binomial proportion"), that bound is replaced there by the one-sided
Poisson bound (the λ with P(Poisson(λ) ≥ k) = 2.5%, over n), and symmetrically for n−1..n−3 flips.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
# λ with P(Poisson(λ) >= k) = 0.025, for k = 1, 2, 3 (solved by bisection; the 95% two-sided level only)
POISSON_LOWER = {1: 0.02531780798428984, 2: 0.24220927854396457, 3: 0.6186721228956004}


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for k successes in n trials; (0, 1) when n is 0 (nothing observed)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    if z == Z95:
        if k in POISSON_LOWER:
            low = min(low, POISSON_LOWER[k] / n)
        if n - k in POISSON_LOWER:
            high = max(high, 1.0 - POISSON_LOWER[n - k] / n)
    # exact at the ends: 0 of n cannot have a positive lower bound, n of n an upper bound below 1
    return (0.0 if k == 0 else low), (1.0 if k == n else high)


@dataclass(frozen=True)
class Observed:
    """One case over the draws."""

    n: int  # draws
    flips: int  # draws whose tokens differ from the reference
    verdict_flips: int | None  # graded draws whose verdict differs from the reference's (None: ungraded)
    graded: int

    @property
    def p_flip(self) -> float | None:
        return self.flips / self.n if self.n else None

    @property
    def interval(self) -> tuple[float | None, float | None]:
        return wilson(self.flips, self.n) if self.n else (None, None)

    @property
    def p_verdict_flip(self) -> float | None:
        return None if self.verdict_flips is None or not self.graded else self.verdict_flips / self.graded

    def columns(self) -> dict[str, float | int | None]:
        low, high = self.interval
        return {"n_draws": self.n, "p_flip": self.p_flip, "p_flip_low": low, "p_flip_high": high,
                "p_verdict_flip": self.p_verdict_flip}


def observe(reference: Sequence[int], ref_passed: bool | None, draws: Sequence[tuple[Sequence[int], bool | None]]
            ) -> Observed:
    """A case's reference tokens and verdict against each draw's (tokens, verdict)."""
    ref = list(reference)
    flips = sum(list(tokens) != ref for tokens, _ in draws)
    graded = [passed for _, passed in draws if passed is not None] if ref_passed is not None else []
    verdict_flips = sum(passed != ref_passed for passed in graded) if ref_passed is not None else None
    return Observed(len(draws), flips, verdict_flips, len(graded))


def agreement_rates(outputs: Mapping[str, Sequence[Sequence[int]]],
                    verdicts: Mapping[str, Sequence[bool | None]]) -> dict[str, float | int | None]:
    """TARr@N: the share of cases whose N draws all gave the same tokens; TARa@N: the share of graded cases
    whose N draws all got the same verdict (the verdict stands in for the parsed answer: it is what the
    suite's checks extract and judge)."""
    n_cases = len(outputs)
    same_raw = sum(len({tuple(t) for t in draws}) <= 1 for draws in outputs.values())
    graded = {case: [v for v in vs if v is not None] for case, vs in verdicts.items()}
    graded = {case: vs for case, vs in graded.items() if vs}
    same_answer = sum(len(set(vs)) == 1 for vs in graded.values())
    n = max((len(d) for d in outputs.values()), default=0)
    return {"n": n, "tar_r": same_raw / n_cases if n_cases else None,
            "tar_a": same_answer / len(graded) if graded else None}
