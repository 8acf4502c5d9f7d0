"""Each axis's reading, from its units' traces against their baselines.

Per target, a comparison reads
- `holds`: every token and every top-1/top-2 logprob bitwise equal;
- `tokens_hold`: the same tokens, some logprob differs (the numbers moved, not far enough to flip a token);
- `breaks`: the tokens differ; the first divergence, the reference's top-1/top-2 gap there and the flip kind
  (tie / near-tie / confident: rounding noise, or a real change of computation) say how.

An axis reads `breaks` when any of its comparisons does (n of m), else `tokens_hold` when any does, else
`holds`; the co-resident axis says at which number of requests in flight it first broke. One more reading
keeps the axes apart: an axis whose answers differ while an axis it cannot be told from differs too — every
axis and run to run; arrival position and chunked prefill and co-resident sequences at their load — reads
`not_isolated` (its counts kept): what moved it may be the other axis. An axis that holds, holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flakecheck.analysis.divergence import first_divergence
from flakecheck.analysis.flip_kind import classify_flip
from flakecheck.data.traces import Trace
from flakecheck.probe.conformance.plan import AXES, Unit

HOLDS, TOKENS_HOLD, BREAKS, NOT_ISOLATED, UNSUPPORTED = "holds", "tokens_hold", "breaks", "not_isolated", "unsupported"
READINGS = (HOLDS, TOKENS_HOLD, BREAKS, NOT_ISOLATED, UNSUPPORTED)
NEAR_TIE = 0.05  # the probe's default --gap-threshold


@dataclass(frozen=True)
class Comparison:
    target: str
    reading: str
    first_divergence: int | None = None
    gap: float | None = None  # the baseline's top-1/top-2 logprob gap at the first divergence
    flip_kind: str | None = None
    max_logprob_shift: float = 0.0  # the largest change of a top-1 or top-2 logprob before any divergence


@dataclass
class LevelReading:
    level: str
    in_flight: int
    reading: str
    n: int  # comparisons
    breaks: int = 0
    tokens_hold: int = 0
    unsupported: str | None = None
    comparisons: list[Comparison] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "comparisons": [asdict(c) for c in self.comparisons]}


@dataclass
class AxisReading:
    axis: str
    reading: str
    levels: list[LevelReading]
    breaks_at: str | None = None  # the first level (in the sweep's order) that broke
    first_break: Comparison | None = None
    note: str | None = None

    @property
    def n(self) -> int:
        return sum(level.n for level in self.levels)

    @property
    def n_breaks(self) -> int:
        return sum(level.breaks for level in self.levels)

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "reading": self.reading, "breaks": self.n_breaks, "compared": self.n,
                "breaks_at": self.breaks_at, "first_break": asdict(self.first_break) if self.first_break else None,
                "note": self.note, "levels": [level.to_dict() for level in self.levels]}


def compare(baseline: Trace, other: Trace, how: str, dtype: str, gap_noise: float) -> Comparison:
    """One target's answer against its baseline's. `how`: full | prefix (the shorter answer must be a prefix of
    the longer, its last token excepted: a stop sequence may end inside it) | top1 (tokens and their logprobs)."""
    a, b = baseline, other
    end = None
    if how == "prefix":
        end = max(0, min(len(a.token_ids), len(b.token_ids)) - 1)
    ids_a, ids_b = a.token_ids[:end], b.token_ids[:end]
    step = first_divergence(ids_a, ids_b)
    upto = len(ids_a) if step is None else step
    fields_ = ("top1_logprobs",) if how == "top1" else ("top1_logprobs", "top2_logprobs")
    shift = max((abs(getattr(a, f)[i] - getattr(b, f)[i]) for f in fields_ for i in range(min(upto, len(ids_b)))),
                default=0.0)
    same_runner_up = how == "top1" or a.top2_ids[:upto] == b.top2_ids[:upto]
    if step is None:
        reading = HOLDS if shift == 0.0 and same_runner_up else TOKENS_HOLD
        return Comparison(other.case_id, reading, max_logprob_shift=shift)
    gap = a.top1_logprobs[step] - a.top2_logprobs[step] if step < len(a.token_ids) else None
    kind = classify_flip(gap, None, dtype, NEAR_TIE, gap_noise) if gap is not None else None
    return Comparison(other.case_id, BREAKS, step, gap, kind, shift)


def read_level(unit: Unit, traces: Sequence[Trace], baseline: Sequence[Trace], dtype: str, gap_noise: float,
               unsupported: str | None = None) -> LevelReading:
    level = LevelReading(unit.level, unit.in_flight, HOLDS, 0, unsupported=unsupported)
    if unsupported:
        level.reading = UNSUPPORTED
        return level
    base = {t.case_id: t for t in baseline}
    for trace in traces:
        if trace.case_id not in base:
            continue
        c = compare(base[trace.case_id], trace, unit.compare, dtype, gap_noise)
        level.comparisons.append(c)
        level.breaks += c.reading == BREAKS
        level.tokens_hold += c.reading == TOKENS_HOLD
    level.n = len(level.comparisons)
    level.reading = BREAKS if level.breaks else TOKENS_HOLD if level.tokens_hold else HOLDS
    return level


def read_axes(levels: Mapping[str, list[LevelReading]]) -> dict[str, AxisReading]:
    """The axes' readings from their levels' (in the sweep's order), with the isolation rule applied."""
    axes: dict[str, AxisReading] = {}
    for axis in AXES:
        measured = levels.get(axis, [])
        readings = [lv.reading for lv in measured if lv.reading != UNSUPPORTED]
        reading = (BREAKS if BREAKS in readings else TOKENS_HOLD if TOKENS_HOLD in readings
                   else HOLDS if readings else UNSUPPORTED)
        broke = next((lv for lv in measured if lv.reading == BREAKS), None)
        first = next((c for c in broke.comparisons if c.reading == BREAKS), None) if broke else None
        axes[axis] = AxisReading(axis, reading, list(measured), broke.level if broke else None, first)
    for axis, reading in axes.items():
        if reading.reading not in (BREAKS, TOKENS_HOLD):
            continue
        culprit = _confounder(axis, reading, axes)
        if culprit:
            reading.note = f"{reading.reading.replace('_', ' ')}, but {culprit}: this axis cannot be told apart"
            reading.reading = NOT_ISOLATED
    return axes


def _confounder(axis: str, reading: AxisReading, axes: Mapping[str, AxisReading]) -> str | None:
    if axis != "run_to_run" and axes["run_to_run"].reading in (BREAKS, TOKENS_HOLD):
        return "run to run differs too"
    if axis in ("arrival", "chunked_prefill"):
        load = max((lv.in_flight for lv in reading.levels), default=1)
        co = [lv for lv in axes["co_resident"].levels if lv.in_flight <= load and lv.reading in (BREAKS, TOKENS_HOLD)]
        if co:
            return f"co-resident sequences differ already at {co[0].in_flight} in flight"
    return None
