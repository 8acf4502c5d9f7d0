"""Observed flip probability: per case, the share of sampled compositions (draws) whose tokens, and whose
verdict, differ from the reference's, with exact 95% intervals; per suite, the total agreement rates TARr@N
(every draw's raw output identical) and TARa@N (every draw's verdict identical).

The interval is Clopper–Pearson's (1934): the flip probabilities the binomial tails do not reject at 2.5% on
either side. It is the one interval whose coverage is at least its stated level for every true probability
and every number of draws (the Wilson interval this replaced, even with a Poisson bound at the ends, covers only
92.6% of p = 0.53 with 8 draws and 92.0% of p = 0.89 with 32; this one never less than 95%), which is what lets
the gate fail a case on the lower bound and `--repeat auto` stop a case once its interval is decided. The price
is width: 0 flips of 8 leave an upper bound of 0.37, 0 of 32 one of 0.11.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEVEL = 0.95  # the intervals' stated coverage


def binomial_tail_at_least(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in logs (no overflow at thousands of draws)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(n + 1)
    return min(1.0, sum(math.exp(log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)
                        for i in range(k, n + 1)))


def _solve(f: object, target: float) -> float:
    """The p in [0, 1] where the increasing function `f` reaches `target` (bisection to 1e-12)."""
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        if f(mid) < target:  # type: ignore[operator]
            low = mid
        else:
            high = mid
    return (low + high) / 2


@functools.lru_cache(maxsize=65536)  # the rounds of --repeat auto ask for the same few (k, n) again and again
def exact_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Clopper–Pearson for k flips in n draws; (0, 1) when n is 0 (nothing observed)."""
    if n <= 0:
        return 0.0, 1.0
    tail = (1.0 - level) / 2
    low = 0.0 if k == 0 else _solve(lambda p: binomial_tail_at_least(k, n, p), tail)
    # the upper bound: P(X <= k) = tail, i.e. P(X >= k + 1) = 1 - tail
    high = 1.0 if k >= n else _solve(lambda p: binomial_tail_at_least(k + 1, n, p), 1.0 - tail)
    return low, high


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
        return exact_interval(self.flips, self.n) if self.n else (None, None)

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
