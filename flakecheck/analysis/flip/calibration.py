"""How well predicted flip probabilities match observed ones: AUROC (does the prediction rank the cases that
flipped in at least one draw above those that never did), Spearman's rank correlation, the Brier score over
the individual draws, and reliability bins (mean predicted vs mean observed, with counts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

N_BINS = 10


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(a positive scores above a negative), ties counting half; None without both classes."""
    pos = sum(labels)
    neg = len(labels) - pos
    if not pos or not neg:
        return None
    r = ranks(scores)
    rank_sum = sum(rank for rank, label in zip(r, labels) if label)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson's correlation of the ranks; None when either side is constant or there are < 2 pairs."""
    if len(a) < 2:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return None if va == 0 or vb == 0 else cov / (va * vb) ** 0.5


def brier(predicted: Sequence[float], observed: Sequence[float]) -> float | None:
    """The mean squared error of `predicted` against each draw's 0/1 outcome, a case with observed rate p
    contributing p·(1 − q)² + (1 − p)·q² = p·(1 − p) + (q − p)² for its prediction q: a perfectly calibrated
    q = p still scores its outcome's own variance p·(1 − p) (`brier_floor`), and the rest is the squared
    error of the rates (`rate_mse`)."""
    if not predicted:
        return None
    return sum(p * (1 - q) ** 2 + (1 - p) * q * q for q, p in zip(predicted, observed)) / len(predicted)


def brier_floor(observed: Sequence[float]) -> float | None:
    """What a prediction equal to every observed rate would score: the mean of p·(1 − p)."""
    return sum(p * (1 - p) for p in observed) / len(observed) if observed else None


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    n: int
    mean_predicted: float | None
    mean_observed: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {"low": self.low, "high": self.high, "n": self.n, "mean_predicted": self.mean_predicted,
                "mean_observed": self.mean_observed}


def reliability(predicted: Sequence[float], observed: Sequence[float], n_bins: int = N_BINS) -> list[Bin]:
    """Equal-width bins of the prediction over [0, 1] (1.0 falls in the last)."""
    members: list[list[int]] = [[] for _ in range(n_bins)]
    for i, q in enumerate(predicted):
        members[min(n_bins - 1, max(0, int(q * n_bins)))].append(i)
    bins = []
    for b, idx in enumerate(members):
        mean_q = sum(predicted[i] for i in idx) / len(idx) if idx else None
        mean_p = sum(observed[i] for i in idx) / len(idx) if idx else None
        bins.append(Bin(b / n_bins, (b + 1) / n_bins, len(idx), mean_q, mean_p))
    return bins


def calibrate(predicted: Sequence[float | None], observed: Sequence[float | None],
              n_draws: int | None = None) -> dict[str, object] | None:
    """The calibration block of meta.json over the cases with both numbers; None when there are none.
    `n_draws` (the draws per case) states the observed side's resolution, and sets `observed_at_90`."""
    pairs = [(q, p) for q, p in zip(predicted, observed) if q is not None and p is not None]
    if not pairs:
        return None
    q = [a for a, _ in pairs]
    p = [b for _, b in pairs]
    top = max(q)
    return {
        "n_cases": len(pairs),
        "n_draws": n_draws,
        "auroc": auroc(q, [x > 0 for x in p]),
        "spearman": spearman(q, p),
        "brier": brier(q, p),
        "brier_floor": brier_floor(p),
        "rate_mse": sum((a - b) ** 2 for a, b in pairs) / len(pairs),
        "mean_predicted": sum(q) / len(q),
        "mean_observed": sum(p) / len(p),
        "top_shared": sum(x == top for x in q),
        "observed_at_90": sum(x >= 0.9 for x in p),
        "bins": [b.to_dict() for b in reliability(q, p)],
    }
