"""Analysis: from traces to the three tables of the run directory.

Per (case, composition, repeat): the first step whose token differs from the reference
composition's (repeat 0). Per case: the earliest divergence and the token pair there, the
near-ties of the reference within the gap window, the verdicts, the status and the risk.

risk = 1 - prod_i (1 - exp(-gap_i / tau)) over the reference's first `gap_window` steps, where
gap_i = top1 - top2 logprob at step i and tau = the gap threshold: the chance that at least one
step flips if a step with gap g flips with probability exp(-g / tau). A tie (gap 0) gives 1, one
step at the threshold alone gives e^-1 = 0.37, and a gap of 10 tau adds only 5e-5. A case with
no generated tokens has risk 0.

flip_kind classifies each diverged case's first divergence as a tie, a near-tie or a confident flip from
the reference's gap there, the run's dtype and the gap noise the run measured (`gap_noise`: the largest
|gap(other) - gap(reference)| at a step before the two diverged, where both ranked the same two tokens
first; see flakecheck.analysis.flip_kind); a mixture of experts' confident flip is a routing flip when a run
that diverges at that step chose other experts than the reference at that step or before (runs.parquet's
`routing_divergence`). Verdicts come in from outside
(flakecheck.analysis.verdicts: the suite's checks or an external grader); analysis never grades.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flakecheck.analysis.flip.observed import observe
from flakecheck.analysis.flip.predict import NoiseModel, measure_noise, predict
from flakecheck.analysis.flip_kind import classify_flip
from flakecheck.data.routing import routing_divergence
from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace, VerdictKey, run_label


@dataclass(frozen=True)
class Thresholds:
    gap_threshold: float = 0.05
    gap_window: int = 50


@dataclass
class Tables:
    runs: list[dict[str, Any]]
    tokens: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    gap_noise: float = 0.0
    noise: NoiseModel = field(default_factory=lambda: NoiseModel("logprob", "float32", ()))


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first generated token that differs; None when the sequences are identical."""
    for step, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return step
    return None if len(reference) == len(other) else min(len(reference), len(other))


def step_gaps(trace: Trace) -> list[float]:
    return [a - b for a, b in zip(trace.top1_logprobs, trace.top2_logprobs)]


def gap_noise(ref: Trace, other: Trace) -> float:
    """The largest shift of the top-1/top-2 gap between two runs of one case at the steps before their first
    divergence (same context, so the shift is numeric noise), counting only steps where both ranked the same
    two tokens first; 0 when there are none."""
    end = first_divergence(ref.token_ids, other.token_ids)
    end = len(ref.token_ids) if end is None else end
    ref_gaps, other_gaps = step_gaps(ref), step_gaps(other)
    shifts = [abs(other_gaps[i] - ref_gaps[i]) for i in range(end)
              if other.top1_ids[i] == ref.top1_ids[i] and other.top2_ids[i] == ref.top2_ids[i]]
    return max(shifts, default=0.0)


def risk_score(gaps: Sequence[float], tau: float) -> float:
    survive = 1.0
    for gap in gaps:
        survive *= 1.0 - math.exp(-max(gap, 0.0) / tau)
    return 1.0 - survive


def case_status(diverged: bool, verdict_flip: bool, near_ties: int) -> str:
    if verdict_flip:
        return "verdict_flaky"
    if diverged:
        return "flaky"
    return "fragile" if near_ties else "stable"


def analyse(traces: Sequence[Trace], cases: Sequence[Case], reference: str, thresholds: Thresholds,
            decode: Callable[[list[int]], str], token_text: Callable[[int], str], *,
            verdicts: Mapping[VerdictKey, bool | None], dtype: str | None = None,
            draws: Collection[str] = (), noise: NoiseModel | None = None) -> Tables:
    """Traces (in composition order) of every case -> runs, tokens and cases rows.

    `verdicts` holds every trace's pass/fail (None: ungraded) by (case_id, composition, repeat), computed
    before (flakecheck.analysis.verdicts). `dtype` is the dtype the logits were computed in, for flip_kind; None
    (unknown, e.g. a server) classifies as fp32, the smallest noise, so a tie is never over-claimed.
    `draws`: the compositions that are draws from a load (sampled, or a probe's load levels): every case's
    observed flip probability is over their traces (all repeats), and the gap-shift noise that predicts it
    is measured on them; without draws there is no observed probability and the noise is measured on every
    composition other than the reference. `noise`: the noise to predict with instead (a server's measured
    profile), so one serial pass of a server gets its predictions from that server.
    """
    by_case: dict[str, list[Trace]] = {}
    for trace in traces:
        by_case.setdefault(trace.case_id, []).append(trace)
    refs = {case.id: next(t for t in by_case[case.id] if t.composition == reference and t.repeat == 0)
            for case in cases}
    tables = Tables([], [], [])
    # measured over the whole run first: a flip is judged against the noise every case showed
    tables.gap_noise = max((gap_noise(refs[case.id], t) for case in cases for t in by_case[case.id]), default=0.0)
    measured = [(refs[case.id], t) for case in cases for t in by_case[case.id]
                if (t.composition in draws if draws else t is not refs[case.id])]
    tables.noise = noise if noise is not None else measure_noise(measured, dtype)
    for case in cases:
        row = _analyse_case(case, by_case[case.id], refs[case.id], thresholds, decode, token_text,
                            tables, verdicts, dtype or "float32")
        ref = refs[case.id]
        drawn = [t for t in by_case[case.id] if t.composition in draws]
        observed = observe(ref.token_ids, verdicts[(case.id, ref.composition, ref.repeat)],
                           [(t.token_ids, verdicts[(case.id, t.composition, t.repeat)]) for t in drawn])
        row.update(observed.columns() if drawn else dict.fromkeys(observed.columns()))
        row["p_flip_pred"] = predict(ref, tables.noise)
        tables.cases.append(row)
    return tables


def reference_logit(ref: Trace, step: int) -> float | None:
    """The reference's raw top-1 logit at `step`, where the traces carry it (None otherwise)."""
    logits = ref.top1_logits
    if not logits or step >= len(logits) or logits[step] is None:
        return None
    return float(logits[step])


def _analyse_case(case: Case, traces: list[Trace], ref: Trace, thresholds: Thresholds,
                  decode: Callable[[list[int]], str], token_text: Callable[[int], str], tables: Tables,
                  verdicts_by_trace: Mapping[VerdictKey, bool | None], dtype: str) -> dict:
    earliest: tuple[int, Trace] | None = None
    rerouted: dict[int, bool] = {}  # first token divergence -> some run diverging there changed experts by then
    verdicts: list[bool] = []
    texts: dict[tuple[int, ...], str] = {}  # most compositions reproduce the reference: decode it once
    for trace in traces:
        divergence = first_divergence(ref.token_ids, trace.token_ids)
        text = texts.get(tuple(trace.token_ids))
        if text is None:
            text = texts[tuple(trace.token_ids)] = decode(trace.token_ids)
        passed = verdicts_by_trace[(case.id, trace.composition, trace.repeat)]
        if passed is not None:
            verdicts.append(passed)
        if divergence is not None and (earliest is None or divergence < earliest[0]):
            earliest = (divergence, trace)
        routed = routing_divergence(ref.routing_digests, trace.routing_digests)
        if divergence is not None and routed is not None and routed <= divergence:
            rerouted[divergence] = True
        tables.runs.append({
            "case_id": case.id, "composition": trace.composition, "repeat": trace.repeat,
            "token_ids": trace.token_ids, "text": text, "finish_reason": trace.finish_reason,
            "passed": passed, "first_divergence": divergence, "n_tokens": len(trace.token_ids),
            "routing_divergence": routed,
        })
        for step, (token, lp1, top2, lp2) in enumerate(
            zip(trace.token_ids, trace.top1_logprobs, trace.top2_ids, trace.top2_logprobs)
        ):
            tables.tokens.append({
                "case_id": case.id, "composition": trace.composition, "repeat": trace.repeat, "step": step,
                "token_id": token, "token": token_text(token), "logprob": lp1, "top1_id": trace.top1_ids[step],
                "top1_logprob": lp1, "top2_id": top2, "top2_logprob": lp2, "gap": lp1 - lp2,
                "top2_token": token_text(top2),
                "top1_logit": trace.top1_logits[step] if trace.top1_logits is not None else None,
                "routing_margin": trace.routing_margins[step] if trace.routing_margins is not None else None,
                "routing_layer": trace.routing_layers[step] if trace.routing_layers is not None else None,
            })
    window = step_gaps(ref)[: thresholds.gap_window]
    near_ties = sum(gap < thresholds.gap_threshold for gap in window)
    verdict_flip = len(set(verdicts)) > 1
    row: dict[str, Any] = {
        "case_id": case.id,
        "status": case_status(earliest is not None, verdict_flip, near_ties),
        "n_compositions": len({t.composition for t in traces}),
        "n_distinct_outputs": len({tuple(t.token_ids) for t in traces}),
        "first_divergence": None, "divergence_composition": None, "ref_token": None, "alt_token": None,
        "gap_at_divergence": None, "flip_kind": None,
        "min_gap": min(window) if window else None,
        "n_near_ties": near_ties,
        "pass_rate": sum(verdicts) / len(verdicts) if verdicts else None,
        "verdict_flip": verdict_flip,
        "risk": risk_score(window, thresholds.gap_threshold),
    }
    if earliest is not None:
        step, trace = earliest
        gap = (ref.top1_logprobs[step] - ref.top2_logprobs[step]) if step < len(ref.token_ids) else None
        row.update({
            "first_divergence": step,
            "divergence_composition": run_label(trace.composition, trace.repeat),
            "ref_token": token_text(ref.token_ids[step]) if step < len(ref.token_ids) else None,
            "alt_token": token_text(trace.token_ids[step]) if step < len(trace.token_ids) else None,
            "gap_at_divergence": gap,
            "flip_kind": classify_flip(gap, reference_logit(ref, step), dtype, thresholds.gap_threshold,
                                       tables.gap_noise, rerouted.get(step, False)),
        })
    return row
