"""The score change from A to B and the interval batch noise alone gives it.

Over the paired cases graded on both sides (a case passes or fails; the score is the share that pass):

- each side's score under each of its compositions (each repeat its own; where both sides were replayed under
  draws from a load, `run --sample` or a probe, under each draw instead, read by
  flakecheck.analysis.flip.score);
- the change: B's mean score over its compositions minus A's over its own, in percentage points. It equals the
  mean over the cases of B's pass rate minus A's;
- the interval: the lowest and the highest difference over every pairing of a composition of A with one of
  B (score_B(b) - score_A(a) for all a, b), i.e. from min B - max A to max B - min A. It is what comparing
  one whole-suite replay of each side shows, depending only on which compositions the two replays met;
- `noise_pp`: how far the interval reaches from the change on its wider side, so that "the change is X pp,
  batch noise alone moves it ±Y pp" holds the whole interval;
- the mixed-run bounds: a production eval run is a mix of compositions (each request lands in its own
  batch), so a pair of such runs can differ by anything from B's worst case minus A's best case to B's
  best case minus A's worst (worst: passes under every composition; best: under any, as
  flakecheck.analysis.score_swing defines them);
- `beyond_noise_pp`: (improvements - regressions) / graded cases: the part of the change no pairing of
  compositions can undo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flakecheck.analysis.flip.score import score_distribution
from flakecheck.analysis.score_swing import score_swing

Verdicts = Mapping[str, Mapping[str, "bool | None"]]


@dataclass(frozen=True)
class ScoreChange:
    n_graded: int  # paired cases with a verdict on both sides
    over: str  # "compositions" | "draws": what the interval pairs
    scores_a: tuple[float, ...]  # per composition (or draw) of A
    scores_b: tuple[float, ...]
    reference_a: float | None  # under each side's reference composition: the one-run diff's scores
    reference_b: float | None
    worst_a: float | None
    best_a: float | None
    worst_b: float | None
    best_b: float | None
    beyond_noise: float | None  # (improvements - regressions) / n_graded

    @property
    def mean_a(self) -> float | None:
        return sum(self.scores_a) / len(self.scores_a) if self.scores_a else None

    @property
    def mean_b(self) -> float | None:
        return sum(self.scores_b) / len(self.scores_b) if self.scores_b else None

    @property
    def change_pp(self) -> float | None:
        if self.mean_a is None or self.mean_b is None:
            return None
        return 100.0 * (self.mean_b - self.mean_a)

    @property
    def low_pp(self) -> float | None:
        return 100.0 * (min(self.scores_b) - max(self.scores_a)) if self.scores_a and self.scores_b else None

    @property
    def high_pp(self) -> float | None:
        return 100.0 * (max(self.scores_b) - min(self.scores_a)) if self.scores_a and self.scores_b else None

    @property
    def noise_pp(self) -> float | None:
        change, low, high = self.change_pp, self.low_pp, self.high_pp
        if change is None or low is None or high is None:
            return None
        return max(change - low, high - change)

    @property
    def raw_pp(self) -> float | None:
        if self.reference_a is None or self.reference_b is None:
            return None
        return 100.0 * (self.reference_b - self.reference_a)

    @property
    def mixed_pp(self) -> tuple[float, float] | None:
        if None in (self.worst_a, self.best_a, self.worst_b, self.best_b):
            return None
        return 100.0 * (self.worst_b - self.best_a), 100.0 * (self.best_b - self.worst_a)  # type: ignore[operator]

    @property
    def beyond_noise_pp(self) -> float | None:
        return None if self.beyond_noise is None else 100.0 * self.beyond_noise

    def to_dict(self) -> dict[str, object]:
        mixed = self.mixed_pp
        return {"n_graded": self.n_graded, "over": self.over, "mean_a": self.mean_a, "mean_b": self.mean_b,
                "change_pp": self.change_pp, "noise_pp": self.noise_pp,
                "interval_pp": None if self.low_pp is None else [self.low_pp, self.high_pp],
                "raw_pp": self.raw_pp, "reference_a": self.reference_a, "reference_b": self.reference_b,
                "mixed_runs_pp": None if mixed is None else list(mixed), "beyond_noise_pp": self.beyond_noise_pp,
                "per_composition_a": list(self.scores_a), "per_composition_b": list(self.scores_b),
                "sentence": change_sentence(self)}


def score_change(pairs: Sequence[tuple[str, str]], verdicts_a: Verdicts, verdicts_b: Verdicts,
                 labels_a: Sequence[str], labels_b: Sequence[str], draws_a: Sequence[str], draws_b: Sequence[str],
                 reference_a: str, reference_b: str, n_regressions: int, n_improvements: int) -> ScoreChange:
    """`pairs`: (A's id, B's id); `verdicts_*`: case id -> label -> passed; `labels_*`: every label of a side,
    `draws_*` those that are draws (both non-empty: the interval pairs the draws)."""
    graded = [(a, b) for a, b in pairs if _graded(verdicts_a.get(a, {})) and _graded(verdicts_b.get(b, {}))]
    on_a = {a: verdicts_a[a] for a, _ in graded}
    on_b = {a: verdicts_b[b] for a, b in graded}  # keyed by A's id: one case, two sides
    swing_a, swing_b = score_swing(on_a, labels_a), score_swing(on_b, labels_b)
    over = "draws" if draws_a and draws_b else "compositions"
    if over == "draws":
        scores_a = score_distribution(on_a, draws_a, reference_a).scores
        scores_b = score_distribution(on_b, draws_b, reference_b).scores
    else:
        scores_a = tuple(s for s in swing_a.per_composition.values() if s is not None)
        scores_b = tuple(s for s in swing_b.per_composition.values() if s is not None)
    return ScoreChange(len(graded), over, tuple(scores_a), tuple(scores_b), swing_a.per_composition.get(reference_a),
                       swing_b.per_composition.get(reference_b), swing_a.worst, swing_a.best, swing_b.worst,
                       swing_b.best, (n_improvements - n_regressions) / len(graded) if graded else None)


def change_sentence(score: ScoreChange) -> str:
    """'the score changes by -6.6 pp (A 45.9% → B 39.3%); batch noise alone moves it ±3.3 pp (...)'."""
    change, noise = score.change_pp, score.noise_pp
    if change is None or noise is None or score.mean_a is None or score.mean_b is None:
        return "no case is graded on both sides: no score to compare"
    pairings = len(score.scores_a) * len(score.scores_b)
    return (f"the score changes by {change:+.1f} pp (A {score.mean_a:.1%} → B {score.mean_b:.1%}, "
            f"{score.n_graded} cases graded on both sides); batch noise alone moves it ±{noise:.1f} pp "
            f"({score.low_pp:+.1f} to {score.high_pp:+.1f} pp over the {pairings} pairings of A's and B's "
            f"{score.over})")


def _graded(by_label: Mapping[str, bool | None]) -> bool:
    return any(v is not None for v in by_label.values())
