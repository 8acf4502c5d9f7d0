"""The suite's score under production load: the score under each sampled composition (the share of graded
cases that pass), and over those draws its mean, standard deviation (the sample std, Std@Acc), 5th and 95th
percentiles (linear interpolation), the retry-free score (the share of graded cases that pass under every
draw: what no rerun can take away) and, beside them, the single-run score of the reference composition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ScoreDistribution:
    n_draws: int
    n_graded: int
    single_run: float | None
    scores: tuple[float, ...]  # per draw, in draw order (draws without any verdict left out)
    retry_free: float | None

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.scores)) if self.scores else None

    @property
    def std(self) -> float | None:
        return float(np.std(self.scores, ddof=1)) if len(self.scores) > 1 else None

    def percentile(self, q: float) -> float | None:
        return float(np.percentile(self.scores, q)) if self.scores else None

    def to_dict(self) -> dict[str, object]:
        std = self.std
        return {"n_draws": self.n_draws, "n_graded": self.n_graded, "single_run": self.single_run,
                "mean": self.mean, "std": std, "std_pp": None if std is None else 100.0 * std,
                "p5": self.percentile(5), "p95": self.percentile(95), "retry_free": self.retry_free,
                "per_draw": list(self.scores)}


def score_distribution(verdicts: Mapping[str, Mapping[str, bool | None]], draws: Sequence[str],
                       reference: str) -> ScoreDistribution:
    """`verdicts`: case id -> run label -> passed (None: ungraded; no key: the case was not drawn there)."""
    graded = [case for case, by_label in verdicts.items()
              if any(by_label.get(label) is not None for label in [reference, *draws])]
    # under `probe --repeat auto` a later round draws only the cases still undecided: a score over those few is
    # not the suite's, so only the draws every graded case took part in count
    draws = [label for label in draws if all(label in verdicts[case] for case in graded)]
    scores = []
    for label in draws:
        here = [verdicts[case].get(label) for case in graded]
        here = [v for v in here if v is not None]
        if here:
            scores.append(sum(here) / len(here))
    ref = [verdicts[case].get(reference) for case in graded]
    ref = [v for v in ref if v is not None]
    passing = [all(verdicts[case].get(label) is not False for label in draws) for case in graded
               if any(verdicts[case].get(label) is not None for label in draws)]
    return ScoreDistribution(len(draws), len(graded), sum(ref) / len(ref) if ref else None, tuple(scores),
                             sum(passing) / len(passing) if passing else None)
