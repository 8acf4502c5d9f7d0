"""Predicted flip probability from the reference alone, using the numeric noise the run measured.

The noise: every shift of a top-1/top-2 gap between the reference and another composition at a step where
both still read the same context (before their first divergence) and ranked the same two tokens first —
the empirical distribution, not its maximum. Where the traces carry the raw logits, a shift is measured in
ulps of the dtype at the candidates' magnitude (a bf16 logit near 20 moves in steps of 1/8, one near 5 in
steps of 1/32), so steps at different logit magnitudes pool into one distribution per dtype; otherwise (a
server reports logprobs only) in logprob units.

A step whose reference gap is g flips when the other composition's noise pushes the runner-up past the
leader: with shifts as likely up as down, p_step(g) = ½ · P(|shift| > g). A shift of exactly g (the noise
is quantised: logits move by whole ulps) leaves the two candidates tied, which the argmax breaks either way:
it counts one half of that, p_step(g) = ½ · P(|shift| > g) + ¼ · P(|shift| = g). An exact tie (g = 0)
therefore flips half the times its step's numbers change at all, and a gap wider than every shift measured
never does. "Equal" allows EQUAL_TOLERANCE for the fp32 rounding of the log-softmax. A case flips when any
of its steps does: p_flip_pred = 1 − ∏ (1 − p_step(g_i)) over every step of the reference's output.
Two cases get equal predictions only when their gaps give equal products.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flakecheck.analysis.flip_kind import dtype_name, ulp
from flakecheck.data.traces import Trace

UNITS = ("ulp", "logprob")
EQUAL_TOLERANCE = {"ulp": 1e-3, "logprob": 1e-6}  # a thousandth of an ulp; fp32 rounding of a logprob gap


@dataclass(frozen=True)
class NoiseModel:
    """Sorted |gap shift|s in `unit` (ulps of `dtype`, or logprob)."""

    unit: str
    dtype: str
    shifts: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.shifts)

    @property
    def changed(self) -> float:
        """The share of measured steps whose gap moved by more than EQUAL_TOLERANCE: a server's logprobs move by
        ~1e-7 whenever any other logit of the step moves (the log-softmax's fp32 rounding), which no gap can
        flip on; those count as unchanged."""
        return self.exceeding(EQUAL_TOLERANCE[self.unit])

    def exceeding(self, gap: float) -> float:
        """P(|shift| > gap)."""
        if not self.shifts:
            return 0.0
        return (len(self.shifts) - bisect.bisect_right(self.shifts, gap)) / len(self.shifts)

    def step_flip(self, gap: float) -> float:
        tolerance = EQUAL_TOLERANCE[self.unit]
        gap = max(gap, 0.0)
        if gap <= tolerance:  # a tie: any change of its numbers decides it one way or the other
            return 0.5 * self.exceeding(tolerance)
        above = self.exceeding(gap + tolerance)
        return 0.5 * above + 0.25 * (self.exceeding(gap - tolerance) - above)

    def quantiles(self) -> dict[str, float | None]:
        def q(p: float) -> float | None:
            if not self.shifts:
                return None
            return self.shifts[min(len(self.shifts) - 1, int(p * len(self.shifts)))]

        return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": self.shifts[-1] if self.shifts else None}

    def to_dict(self) -> dict[str, object]:
        return {"unit": self.unit, "dtype": self.dtype, "n_shifts": self.n, "changed": self.changed,
                **self.quantiles()}


def _in_units(gap: float, logit: float | None, dtype: str, unit: str) -> float:
    if unit == "logprob" or logit is None or not math.isfinite(logit):
        return gap
    magnitude = max(abs(logit), abs(logit - max(gap, 0.0)))
    return gap / ulp(magnitude, dtype)


def _unit_of(traces: Iterable[Trace]) -> str:
    return "ulp" if all(t.top1_logits is not None for t in traces) else "logprob"


def measure_noise(pairs: Sequence[tuple[Trace, Trace]], dtype: str | None) -> NoiseModel:
    """Every gap shift between (reference, other) traces of one case, before they diverged."""
    name = dtype_name(dtype) if dtype else "float32"
    unit = _unit_of(t for pair in pairs for t in pair) if pairs else "logprob"
    shifts: list[float] = []
    for ref, other in pairs:
        for step in range(min(len(ref.token_ids), len(other.token_ids))):
            if ref.token_ids[step] != other.token_ids[step]:
                break  # past here the contexts differ: not noise
            if other.top1_ids[step] != ref.top1_ids[step] or other.top2_ids[step] != ref.top2_ids[step]:
                continue
            ref_gap = ref.top1_logprobs[step] - ref.top2_logprobs[step]
            other_gap = other.top1_logprobs[step] - other.top2_logprobs[step]
            logit = ref.top1_logits[step] if unit == "ulp" and ref.top1_logits is not None else None
            shifts.append(abs(_in_units(other_gap, logit, name, unit) - _in_units(ref_gap, logit, name, unit)))
    return NoiseModel(unit, name, tuple(sorted(shifts)))


def predict(ref: Trace, noise: NoiseModel) -> float | None:
    """The chance that a composition drawn like the measured ones changes the case's tokens; None when no
    noise was measured (no other composition to compare with)."""
    if not noise.n:
        return None
    survive = 1.0
    for step in range(len(ref.token_ids)):
        gap = ref.top1_logprobs[step] - ref.top2_logprobs[step]
        logit = ref.top1_logits[step] if noise.unit == "ulp" and ref.top1_logits is not None else None
        survive *= 1.0 - noise.step_flip(_in_units(gap, logit, noise.dtype, noise.unit))
    return 1.0 - survive
