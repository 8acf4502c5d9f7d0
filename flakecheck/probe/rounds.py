"""Which (load level, repeat, cases) a probe sends, in order: every level `--repeat N` times for every case, or,
under `--repeat auto`, the serial reference once and then rounds of the levels above it for the cases whose
flip probability is still undecided (flakecheck.analysis.flip.adaptive says which).

A round for fewer cases than a level keeps in flight is topped up with that many more filler requests, so the
cases still measured meet the same number of requests in flight as in the first round. Each round is decided
from the traces of the rounds before it alone, so `--resume` recomputes the same rounds from what was saved.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flakecheck.analysis.flip.adaptive import AutoDraws, CaseDraws, case_states, next_round, stop_reason
from flakecheck.analysis.flip.predict import NoiseModel
from flakecheck.data.traces import Trace
from flakecheck.probe.bodies import CasePrompt
from flakecheck.probe.levels import REFERENCE, LoadLevel

Unit = tuple[LoadLevel, int, list[CasePrompt]]


def flat_units(levels: Sequence[LoadLevel], repeat: int, cases: list[CasePrompt]) -> Iterator[Unit]:
    for r in range(repeat):
        for level in levels:
            yield level, r, cases


@dataclass
class AutoRounds:
    """`--repeat auto`: feed it each unit's traces (`saw`) before asking for the next unit."""

    target: AutoDraws
    levels: Sequence[LoadLevel]
    cases: list[CasePrompt]
    dtype: str | None
    noise: NoiseModel | None = None  # the server's measured profile (--noise); None: the draws' own shifts
    refs: dict[str, Trace] = field(default_factory=dict)
    drawn: dict[str, list[Trace]] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)
    case_rounds: int = 0

    def units(self) -> Iterator[Unit]:
        above = [level for level in self.levels if level.name != REFERENCE]
        yield next(level for level in self.levels if level.name == REFERENCE), 0, self.cases
        for r in range(self.target.max_rounds):
            chosen = set(next_round(self.states(), self.target, self.case_rounds)) if r else None
            subset = [c for c in self.cases if chosen is None or c.case_id in chosen]
            if not subset:
                return
            self.case_rounds += len(subset)
            for c in subset:
                self.rounds[c.case_id] = self.rounds.get(c.case_id, 0) + 1
            for level in above:
                # the cases no longer measured are replaced by fillers: the same requests in flight
                yield replace(level, fillers=level.fillers + max(0, level.concurrency - len(subset))), r, subset

    def saw(self, traces: Sequence[Trace]) -> None:
        for t in traces:
            if t.composition == REFERENCE:
                self.refs[t.case_id] = t
            else:
                self.drawn.setdefault(t.case_id, []).append(t)

    def states(self) -> dict[str, CaseDraws]:
        refs = {c.case_id: self.refs[c.case_id] for c in self.cases}  # the suite's order
        return case_states(refs, self.drawn, self.rounds, self.dtype, self.noise)

    def summary(self) -> dict[str, Any]:
        """meta.json's `adaptive` block: the target, the case-rounds spent, each case's rounds and why it
        stopped."""
        states = self.states()
        return {"target": self.target.to_dict(), "case_rounds": self.case_rounds,
                "flat_case_rounds": self.target.max_rounds * len(self.cases),
                "cases": {c: {"rounds": s.rounds, "draws": s.draws, "stopped": stop_reason(s, self.target) or "budget"}
                          for c, s in states.items()}}
