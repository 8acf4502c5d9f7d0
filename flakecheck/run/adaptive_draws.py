"""`run --sample auto`: the draws replayed in rounds, a case measured only while its flip probability is
undecided (flakecheck.analysis.flip.adaptive says which).

A round gives each case it measures `per_round` draws; a replay runs one or more rounds at once (`schedule`),
in one lockstep. The first replays the named compositions and the first round's draws for every case. Each
later replay runs the next rounds' draws; a case it does not measure is still in them, as a shape-only
request of its prompt and its reference's length in its own place (`Composition.shape_only`): its
batch-mates' steps keep their shapes, and of its rows only the prompt blocks a measured case could load from a
prefix cache are computed. A replay's forward passes follow its draws' schedules, whatever it measures, so
fewer, larger replays cost fewer passes, at the price of deciding less often. Each replay is decided from the
traces saved before it alone, so a resumed run replays the same rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flakecheck.analysis.flip.adaptive import AutoDraws, CaseDraws, case_states, stop_reason
from flakecheck.analysis.flip.rank_target import ranked_round
from flakecheck.data.compositions import Composition
from flakecheck.data.traces import Trace

# the replay statistics that add up over the replays (the rest are the first replay's)
SUMMED = ("ticks", "forward_passes", "rows", "shared_rows", "skipped_rows", "steps")


@dataclass
class AdaptiveDraws:
    target: AutoDraws
    named: Sequence[tuple[Composition, int]]  # the named compositions' work (the reference first)
    draws: Sequence[Composition]
    per_round: int  # draws a round gives each case it measures
    schedule: Sequence[int]  # the rounds each replay runs at once, in order
    reference: str
    case_ids: list[str]
    dtype: str | None
    prompt_lengths: dict[str, int] = field(default_factory=dict)  # a case's prompt tokens: its rows' cost
    refs: dict[str, Trace] = field(default_factory=dict)
    drawn: dict[str, list[Trace]] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    replay_costs: list[dict[str, Any]] = field(default_factory=list)  # per replay: its draws, cases, rows, passes, time
    rank_checks: list[dict[str, Any]] = field(default_factory=list)  # each time the ranking was judged

    def work(self, replay: int) -> list[tuple[Composition, int]]:
        """The next replay's (composition, repeat)s; empty: the measuring is over."""
        size = self.schedule[replay]
        start = sum(self.schedule[:replay]) * self.per_round
        batch = list(self.draws[start:start + size * self.per_round])
        if not batch:
            return []
        chosen = self.case_ids if replay == 0 else self._chosen(size)
        if not chosen:
            return []
        measured = set(chosen)
        for case in chosen:
            self.rounds[case] = self.rounds.get(case, 0) + size
        shape = tuple((c, max(1, len(self.refs[c].token_ids))) for c in self.case_ids if c not in measured)
        self.replay_costs.append({"draws": [d.name for d in batch], "cases": len(chosen)})
        draws = [(replace(d, shape_only=shape) if shape else d, 0) for d in batch]
        return [*self.named, *draws] if replay == 0 else draws

    @property
    def ran(self) -> list[str]:
        """The draws replayed so far, in order."""
        return [name for r in self.replay_costs for name in r["draws"]]

    @property
    def case_rounds(self) -> int:
        """The case-rounds measured so far, over every case."""
        return sum(self.rounds.values())

    def _chosen(self, size: int) -> list[str]:
        spent = self.budget_spent() * len(self.case_ids)
        flat_draws = self.target.max_rounds * self.per_round
        chosen, budget, expected = ranked_round(self.states(), self.target, self.budget, spent, self.costs(), size,
                                                flat_draws)
        if expected is not None:  # only a check grows the budget
            self.rank_checks.append({"replay": len(self.replay_costs), "expected_spearman": round(expected, 4),
                                     "budget_rounds": budget})
        return chosen

    @property
    def budget(self) -> float:
        """The rounds a case on average the run may spend: the target's, or as the last ranking check grew it."""
        return self.rank_checks[-1]["budget_rounds"] if self.rank_checks else self.target.budget_rounds

    def costs(self) -> dict[str, float]:
        """What a round of each case costs against the suite's average case: a round of a case computes about
        its prompt's and its answer's rows, so the budget counts those, not the cases."""
        tokens = {c: self.prompt_lengths.get(c, 0) + max(1, len(self.refs[c].token_ids)) for c in self.case_ids}
        mean = sum(tokens.values()) / len(tokens)
        return {c: n / mean for c, n in tokens.items()}

    def budget_spent(self) -> float:
        """The rounds spent a case on average, each at its case's cost (at most `budget`)."""
        cost = self.costs() if self.refs else {c: 1.0 for c in self.case_ids}
        return sum(self.rounds.get(c, 0) * cost[c] for c in cost) / len(cost)

    def cost(self, seconds: float, stats: dict[str, Any]) -> None:
        """What the replay just run cost: its replay time, rows computed and forward passes."""
        self.replay_costs[-1].update(replay_s=round(seconds, 3), rows=stats.get("rows"),
                                    forward_passes=stats.get("forward_passes"))

    def saw(self, traces: Sequence[Trace]) -> None:
        names = {d.name for d in self.draws}
        for t in traces:
            if t.composition == self.reference and t.repeat == 0:
                self.refs[t.case_id] = t
            elif t.composition in names:
                self.drawn.setdefault(t.case_id, []).append(t)

    def states(self) -> dict[str, CaseDraws]:
        refs = {c: self.refs[c] for c in self.case_ids}
        return case_states(refs, self.drawn, self.rounds, self.dtype)

    def summary(self) -> dict[str, Any]:
        """meta.json's `adaptive` block (as a probe's): the target, the case-rounds spent against a flat
        `--sample 32`'s, what each replay measured and cost, per case its rounds, draws and why it stopped."""
        return {"target": self.target.to_dict(), "draws_per_round": self.per_round,
                "rounds_per_replay": list(self.schedule), "case_rounds": self.case_rounds,
                "budget_spent": round(self.budget_spent(), 4), "budget_rounds": self.budget,
                "rank_checks": list(self.rank_checks),
                "flat_case_rounds": self.target.max_rounds * len(self.case_ids), "draws_run": self.ran,
                "replays": list(self.replay_costs),
                "cases": {c: {"rounds": s.rounds, "draws": s.draws, "stopped": stop_reason(s, self.target) or "budget"}
                          for c, s in self.states().items()}}


def add_stats(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """A replay's statistics added to the replays' before."""
    if not total:
        return dict(more)
    for key in SUMMED:
        if isinstance(more.get(key), int):
            total[key] = int(total.get(key) or 0) + more[key]
    for key in ("peak_rows", "peak_slots"):
        if isinstance(more.get(key), int):
            total[key] = max(int(total.get(key) or 0), more[key])
    return total
