"""Adaptive draws (`probe --repeat auto`, `run --sample auto`): spend draws where a case's flip probability is
still uncertain.

Draws go in rounds; a round gives each chosen case one more draw (every load level above the reference). After
each round a case stops when

- it **cannot flip**: none of its draws flipped and the noise prediction gives it 0 (no gap of its reference
  within the largest shift the draws, or the server's measured noise, produced);
- it **rarely flips** (where `rarely_flips` is set: the simulation, whose prediction comes from the very
  draws it predicts): none of its draws flipped and the prediction puts a draw's flip probability below
  1 − 0.5^(1/N), N the draws of the flat pass it stands in for (`max_rounds` rounds): the flip probability at
  which that flat pass would see no flip as often as one, so the flipped-or-not decision it would most likely
  reach is already "not flipped" (32 draws: below 2.1%; 8: below 8.3%). Its interval stays the exact one of its
  own draws, wide;
- its exact 95% interval is **decided** against the threshold the reports and the gate judge by (`threshold`:
  the lower bound above it, or the upper bound at or below it);
- it has had `max_rounds` rounds (the flat `--repeat` it stands in for).

While cases are undecided, each round draws for all of them; when the budget cannot pay for every one, the
cases with no flip yet go first (their flipped-or-not decision, stable or flaky in every report, is still
open), then the widest intervals. Once none is, what is left of the budget goes, one round at a time, to the
cases whose intervals are widest among those that can still flip and have rounds left (a decided case's rate
is still ranked). With `rank_decided` (the simulation) the decided cases do not wait: after the undecided
cases with no flip yet, every case that can still flip competes for each round's budget by the width of its
interval, decided against the threshold or not, because where nearly every case flips, ranking them is what
the budget buys, and a replay of several rounds leaves no later round for what the undecided leave. The
budget is `budget_rounds` rounds a case on average, counted over the whole suite; where a
round of one case costs more than of another (the simulation's rows follow a case's tokens), each round is
counted at its cost.

The interval stays the exact one of observed.py: stopping on it does not change how it is computed, and a test
measures its coverage under this stopping rule against known flip probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from flakecheck.analysis.flip.observed import exact_interval
from flakecheck.analysis.flip.predict import NoiseModel, measure_noise, predict
from flakecheck.data.traces import Trace


@dataclass(frozen=True)
class AutoDraws:
    """What `--repeat auto` aims for, typed once at the door."""

    threshold: float = 0.1  # the flip probability a case is decided against
    budget_rounds: float = 4.0  # rounds a case on average, over the suite
    max_rounds: int = 8  # rounds one case may get
    # stop "rarely flips" cases: only where the prediction is measured from the very draws it predicts (the
    # simulation); a server's flips follow its own batches, which a prediction can tell apart but not rank
    rarely_flips: bool = False
    # a decided case's rate competes for each round's budget, widest interval first, beside the undecided cases
    # that have flipped (only the ones with no flip yet go before it): where most cases flip, ranking them is
    # what the budget buys (the simulation). Off, the undecided keep the budget until none is left (a server's
    # probe, whose rounds of one draw each leave later rounds for it)
    rank_decided: bool = False
    # the Spearman the observed rates should be expected to reach against a flat pass of `max_rounds` rounds,
    # the budget growing a round a case at a time up to `budget_most` while they are not (None: it never
    # grows; flakecheck.analysis.flip.rank_target)
    rank_goal: float | None = None
    budget_most: float | None = None
    spec: str = "auto"  # how it was asked for, as recorded (`auto`, `auto:12`)

    def to_dict(self) -> dict[str, float | int | bool | None]:
        out: dict[str, float | int | bool | None] = {
            "threshold": self.threshold, "budget_rounds": self.budget_rounds, "max_rounds": self.max_rounds,
            "rarely_flips": self.rarely_flips}
        # the ranking's settings only where on (the simulation): a probe's record, and the fingerprint a resumed
        # probe must match, stay as they were before these existed
        if self.rank_decided or self.rank_goal is not None:
            out |= {"rank_decided": self.rank_decided, "rank_goal": self.rank_goal, "budget_most": self.budget_most}
        return out


@dataclass(frozen=True)
class CaseDraws:
    """One case so far: its draws, how many flipped, and the noise prediction (None: not known yet)."""

    draws: int
    flips: int
    predicted: float | None
    rounds: int

    @property
    def width(self) -> float:
        low, high = exact_interval(self.flips, self.draws)
        return high - low


def rare_below(flat_draws: int) -> float:
    """The flip probability below which a flat pass of `flat_draws` draws more likely sees no flip than one."""
    return 1.0 - 0.5 ** (1.0 / flat_draws)


def stop_reason(case: CaseDraws, target: AutoDraws) -> str | None:
    """Why a case needs no more draws to be decided ('cannot flip', 'rarely flips', 'above', 'below', 'cap'),
    or None."""
    if case.rounds >= target.max_rounds:
        return "cap"
    if case.draws and case.flips == 0 and case.predicted == 0.0:
        return "cannot flip"
    if not case.draws:
        return None
    if target.rarely_flips and case.flips == 0 and case.predicted is not None:
        per_round = max(1, case.draws // max(1, case.rounds))
        if case.predicted < rare_below(target.max_rounds * per_round):
            return "rarely flips"
    low, high = exact_interval(case.flips, case.draws)
    if low > target.threshold:
        return "above"
    if high <= target.threshold:
        return "below"
    return None


def next_round(cases: Mapping[str, CaseDraws], target: AutoDraws, rounds_spent: float,
               cost: Mapping[str, float] | None = None, size: int = 1) -> list[str]:
    """The cases that get a draw in the next round (in the suite's order); empty: the measuring is over.
    `rounds_spent`: case-rounds drawn so far, over every case, each weighted by its `cost` (what a round of
    that case costs against the suite's average case, 1 where not given): the budget is then `budget_rounds`
    average rounds a case, whichever cases spend it. `size`: the rounds the next replay gives each case it
    chooses at once (the simulation replays several rounds' draws in one lockstep); a case is charged all of
    them, and one they would take past `max_rounds` is passed over."""
    weight = (lambda c: cost[c]) if cost is not None else (lambda c: 1.0)
    left = target.budget_rounds * sum(weight(c) for c in cases) - rounds_spent
    order = list(cases)
    reasons = {c: stop_reason(cases[c], target) for c in order}
    undecided = [c for c in order if reasons[c] is None]
    can_flip = [c for c in order if reasons[c] in (None, "above", "below")]  # undecided or decided, in order
    pool = can_flip if target.rank_decided else undecided or can_flip
    chosen = set()
    for case in _priority(pool, cases, reasons):  # a case the budget left cannot pay is passed over
        if weight(case) * size <= left + 1e-9 and cases[case].rounds + size <= target.max_rounds:
            chosen.add(case)
            left -= weight(case) * size
    return [c for c in order if c in chosen]


def _priority(pool: Sequence[str], cases: Mapping[str, CaseDraws], reasons: Mapping[str, str | None]) -> list[str]:
    # an undecided case with no flip yet first: its flipped-or-not decision is still open, where one flip
    # settled it for the others; then the widest interval, fewer draws among equal widths; the suite's order
    # breaks the rest (deterministic, resumable)
    def key(c: str) -> tuple[bool, float, int]:
        return (not (cases[c].flips == 0 and reasons[c] is None), -round(cases[c].width, 12), cases[c].draws)
    return sorted(pool, key=key)


def case_states(refs: Mapping[str, Trace], drawn: Mapping[str, Sequence[Trace]], rounds: Mapping[str, int],
                dtype: str | None, noise: NoiseModel | None = None) -> dict[str, CaseDraws]:
    """Each case's draws so far from its reference and its drawn traces; the prediction from `noise` (a
    server's measured profile) or else from the gap shifts the draws themselves show."""
    noise = noise or measure_noise([(refs[c], t) for c, ts in drawn.items() for t in ts], dtype)
    out = {}
    for case, ref in refs.items():
        mine = drawn.get(case, [])
        flips = sum(t.token_ids != ref.token_ids for t in mine)
        out[case] = CaseDraws(len(mine), flips, predict(ref, noise), rounds.get(case, 0))
    return out


def measure(case_ids: Sequence[str], draw: Callable[[str], bool], predicted: Mapping[str, float | None],
            target: AutoDraws, per_round: int = 1) -> dict[str, CaseDraws]:
    """The rounds run against a source of draws (`draw(case)`: did this draw flip?), each case's prediction
    known up front: what `--repeat auto` ends with, for a fake server in a test or a benchmark. `per_round`:
    draws a round gives a case (the load levels above the reference)."""
    cases = {c: CaseDraws(0, 0, predicted.get(c), 0) for c in case_ids}
    spent = 0
    for r in range(target.max_rounds):
        chosen = list(case_ids) if r == 0 else next_round(cases, target, spent)
        if not chosen:
            break
        spent += len(chosen)
        for c in chosen:
            s = cases[c]
            flips = sum(draw(c) for _ in range(per_round))
            cases[c] = CaseDraws(s.draws + per_round, s.flips + flips, s.predicted, s.rounds + 1)
    return cases
