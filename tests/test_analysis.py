"""Properties of the analysis: first divergence, risk, statuses, verdicts — on synthetic traces."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from flakecheck.analysis.divergence import Thresholds, analyse, first_divergence, risk_score
from flakecheck.analysis.verdicts import grade_traces
from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace
from flakecheck.grading.checks import parse_check

tokens = st.lists(st.integers(0, 5), max_size=12)


@given(tokens, tokens)
def test_first_divergence_is_the_first_differing_step(a: list[int], b: list[int]) -> None:
    d = first_divergence(a, b)
    if a == b:
        assert d is None
        return
    assert d is not None and a[:d] == b[:d]
    assert d == min(len(a), len(b)) or a[d] != b[d]


@given(st.lists(st.floats(0, 5), max_size=20), st.integers(0, 19), st.floats(0, 1))
def test_risk_is_a_probability_that_rises_as_a_gap_shrinks(gaps: list[float], i: int, shrink: float) -> None:
    r = risk_score(gaps, 0.05)
    assert 0.0 <= r <= 1.0
    if gaps:
        smaller = list(gaps)
        smaller[i % len(gaps)] *= shrink
        assert risk_score(smaller, 0.05) >= r
        assert risk_score([*gaps, 0.0], 0.05) == 1.0
    assert risk_score([], 0.05) == 0.0
    assert math.isclose(risk_score([0.05], 0.05), math.exp(-1))


def _trace(case_id: str, comp: str, ids: list[int], gaps: list[float], repeat: int = 0) -> Trace:
    top1 = [-0.1] * len(ids)
    return Trace(case_id, comp, repeat, ids, ids, top1, [i + 100 for i in ids],
                 [lp - g for lp, g in zip(top1, gaps)], "length")


TEXT = {1: "A", 2: "B", 3: "C", 4: "D", 5: "E"}


def _decode(ids: list[int]) -> str:
    return "".join(TEXT.get(i, "?") for i in ids)


def _case(case_id: str, target: str | None = None) -> Case:
    checks = (parse_check({"type": "starts-with", "value": target}, "s.jsonl", 1, "checks"),) if target else ()
    return Case(case_id, "q", (), checks, None, {}, 1)


def _analyse(traces: list[Trace], cases: list[Case], thresholds: Thresholds, dtype: str = "bfloat16"):
    """Verdicts first (the suite's checks), then analysis, as a run does."""
    verdicts = grade_traces(traces, cases, _decode)
    return analyse(traces, cases, "solo", thresholds, _decode, lambda t: TEXT.get(t, "?"), verdicts=verdicts,
                   dtype=dtype)


def test_cases_table_reports_the_earliest_divergence_and_its_tokens() -> None:
    ref = _trace("a", "solo", [1, 2, 3, 4], [1.0, 0.5, 0.01, 2.0])
    late = _trace("a", "batch8", [1, 2, 3, 5], [1.0] * 4)
    early = _trace("a", "chunked", [1, 2, 4, 4], [1.0] * 4)
    same = _trace("a", "prefix", [1, 2, 3, 4], [1.0] * 4)
    tables = _analyse([ref, late, early, same], [_case("a", "ABC")], Thresholds(0.05, 50))
    row = tables.cases[0]
    assert (row["first_divergence"], row["divergence_composition"]) == (2, "chunked")
    assert (row["ref_token"], row["alt_token"]) == (TEXT[ref.token_ids[2]], TEXT[early.token_ids[2]])
    assert math.isclose(row["gap_at_divergence"], 0.01, rel_tol=1e-6)
    assert row["n_distinct_outputs"] == 3 and row["n_compositions"] == 4
    # "ABCD", "ABCE" and "ABDD" vs starts-with ABC: the chunked run fails, so the verdict flips.
    assert row["verdict_flip"] and row["status"] == "verdict_flaky"
    assert math.isclose(row["pass_rate"], 3 / 4)
    by_comp = {r["composition"]: r["first_divergence"] for r in tables.runs}
    assert by_comp == {"solo": None, "batch8": 3, "chunked": 2, "prefix": None}
    assert len(tables.tokens) == 16


def test_status_needs_a_near_tie_inside_the_window_for_fragile() -> None:
    tie_late = [_trace("a", "solo", [1, 2, 3], [1.0, 1.0, 0.01]), _trace("a", "b", [1, 2, 3], [1.0] * 3)]
    inside = _analyse(tie_late, [_case("a")], Thresholds(0.05, 3)).cases[0]
    outside = _analyse(tie_late, [_case("a")], Thresholds(0.05, 2)).cases[0]
    assert (inside["status"], inside["n_near_ties"]) == ("fragile", 1)
    assert (outside["status"], outside["n_near_ties"]) == ("stable", 0)
    assert outside["risk"] < inside["risk"]
    assert inside["pass_rate"] is None and not inside["verdict_flip"]


def test_divergence_without_checks_is_flaky_not_verdict_flaky() -> None:
    traces = [_trace("a", "solo", [1, 2], [1.0, 1.0]), _trace("a", "b", [1, 3], [1.0, 1.0])]
    row = _analyse(traces, [_case("a")], Thresholds()).cases[0]
    assert row["status"] == "flaky" and row["first_divergence"] == 1


def test_analysis_takes_the_verdicts_it_is_given() -> None:
    """An external grader's verdicts, not the checks, decide pass rate and verdict flips."""
    traces = [_trace("a", "solo", [1, 2], [1.0, 1.0]), _trace("a", "b", [1, 3], [1.0, 1.0])]
    verdicts = {("a", "solo", 0): False, ("a", "b", 0): True}
    row = analyse(traces, [_case("a", "AB")], "solo", Thresholds(), _decode, TEXT.get, verdicts=verdicts).cases[0]
    assert row["status"] == "verdict_flaky" and row["pass_rate"] == 0.5
    runs = analyse(traces, [_case("a", "AB")], "solo", Thresholds(), _decode, TEXT.get, verdicts=verdicts).runs
    assert [r["passed"] for r in runs] == [False, True]  # the checks would have said [True, False]


def test_flip_kind_at_the_first_divergence() -> None:
    """The reference's gap at the divergence step, logit unknown: a tie within one bf16 ulp at |logit| = 1
    (2**-7), confident at or above 0.05 and above one ulp at |logit| = 64 (0.5), a near-tie between."""
    kinds = {}
    for gap in (0.0, 0.02, 1.0):
        traces = [_trace("a", "solo", [1, 2], [1.0, gap]), _trace("a", "b", [1, 3], [1.0, 1.0])]
        kinds[gap] = _analyse(traces, [_case("a")], Thresholds(0.05, 50)).cases[0]["flip_kind"]
    assert kinds == {0.0: "tie", 0.02: "near_tie", 1.0: "confident"}
    stable = [_trace("a", "solo", [1, 2], [1.0, 0.0]), _trace("a", "b", [1, 2], [1.0, 0.0])]
    assert _analyse(stable, [_case("a")], Thresholds()).cases[0]["flip_kind"] is None
    longer = [_trace("a", "solo", [1], [0.0]), _trace("a", "b", [1, 3], [1.0, 1.0])]  # the reference had ended
    assert _analyse(longer, [_case("a")], Thresholds()).cases[0]["flip_kind"] is None


def test_flip_kind_uses_the_reference_logit_when_the_traces_carry_it() -> None:
    """1/8 is one bf16 ulp at logit 20 (a tie) but four at logit 5 (confident); unknown, it is neither."""
    kinds = []
    for logits in (None, [21.0, 20.0], [6.0, 5.0]):
        ref = dataclasses.replace(_trace("a", "solo", [1, 2], [1.0, 0.125]), top1_logits=logits)
        traces = [ref, _trace("a", "b", [1, 3], [1.0, 1.0])]
        kinds.append(_analyse(traces, [_case("a")], Thresholds(0.05, 50)).cases[0]["flip_kind"])
    assert kinds == ["near_tie", "tie", "confident"]


def test_a_flip_within_the_gap_noise_the_run_measured_is_a_near_tie() -> None:
    """Case `n` shows batch composition shifting a gap by 0.5 before it diverges (same context, same two
    leading tokens): a flip at gap 0.25 elsewhere is noise of that size (near_tie), one at 1.0 is not; without
    that noise the 0.25 flip is confident (fp32 logits: one ulp is negligible, so only the noise decides)."""
    noisy = [_trace("n", "solo", [1, 2, 3], [2.0, 2.0, 2.0]), _trace("n", "b", [1, 2, 4], [2.5, 2.0, 9.0])]
    quiet = [_trace("n", "solo", [1, 2, 3], [2.0, 2.0, 2.0]), _trace("n", "b", [1, 2, 4], [2.0, 2.0, 9.0])]
    kinds = {}
    for label, case_n in (("noisy", noisy), ("quiet", quiet)):
        for gap in (0.25, 1.0):
            flip = [_trace("f", "solo", [1, 2], [1.0, gap]), _trace("f", "b", [1, 3], [1.0, 1.0])]
            tables = _analyse([*case_n, *flip], [_case("n"), _case("f")], Thresholds(0.05, 50), dtype="float32")
            assert math.isclose(tables.gap_noise, 0.5 if label == "noisy" else 0.0)
            kinds[label, gap] = tables.cases[1]["flip_kind"]
    assert kinds == {("noisy", 0.25): "near_tie", ("noisy", 1.0): "confident",
                     ("quiet", 0.25): "confident", ("quiet", 1.0): "confident"}


def test_gap_noise_ignores_the_divergence_onwards_and_other_leading_tokens() -> None:
    """A shift at or after the first divergence (another context), or between different top-2 tokens, is not
    rounding noise of one gap: it is not measured."""
    ref = _trace("a", "solo", [1, 2, 3], [1.0, 1.0, 1.0])
    after = _trace("a", "b", [1, 3, 3], [1.0, 5.0, 5.0])
    other_runner_up = dataclasses.replace(_trace("a", "c", [1, 2, 3], [4.0, 1.0, 1.0]), top2_ids=[7, 102, 103])
    tables = _analyse([ref, after, other_runner_up], [_case("a")], Thresholds(0.05, 50))
    assert tables.gap_noise == 0.0
