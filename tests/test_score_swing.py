"""Score swing arithmetic on constructed verdicts (issue 10 §3); expectations computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.analysis.score_swing import score_swing, swing_sentence

T, F = True, False


def test_four_graded_cases_and_one_ungraded() -> None:
    verdicts = {
        "always": {"A": T, "B": T, "C": T},
        "flips-b": {"A": T, "B": F, "C": T},
        "never": {"A": F, "B": F, "C": F},
        "flips-c": {"A": F, "B": F, "C": T},
        "ungraded": {"A": None, "B": None, "C": None},
    }
    s = score_swing(verdicts, ["A", "B", "C"])
    # A passes always+flips-b = 2/4, B only always = 1/4, C always+flips-b+flips-c = 3/4
    assert s.n_graded == 4 and s.per_composition == {"A": 0.5, "B": 0.25, "C": 0.75}
    assert (s.worst, s.best) == (0.25, 0.75)  # pass everywhere: 1 of 4; somewhere: 3 of 4
    assert s.swing_pp == pytest.approx(50.0)
    assert s.low == ("B", 0.25) and s.high == ("C", 0.75)
    assert swing_sentence(s) == "your reported score can move from 25% to 75% (50.0 pp) from batch composition alone"
    # compositions that also change the TP size say so
    tp = score_swing(verdicts, ["A", "B", "C"], cause="batch composition and TP size")
    assert swing_sentence(tp).endswith("(50.0 pp) from batch composition and TP size alone")


def test_opposite_flips_swing_fully_while_every_composition_scores_the_same() -> None:
    s = score_swing({"x": {"A": T, "B": F}, "y": {"A": F, "B": T}}, ["A", "B"])
    assert s.per_composition == {"A": 0.5, "B": 0.5}
    assert (s.worst, s.best, s.swing_pp) == (0.0, 1.0, 100.0)


def test_a_missing_verdict_leaves_the_case_out_of_that_composition_only() -> None:
    s = score_swing({"x": {"A": T, "B": None}, "y": {"A": F, "B": T}}, ["A", "B"])
    assert s.per_composition == {"A": 0.5, "B": 1.0}  # B: only y was graded there, and it passed
    assert (s.worst, s.best) == (0.5, 1.0)  # x passes wherever graded; y fails under A


def test_no_swing_and_nothing_graded() -> None:
    steady = score_swing({"x": {"A": T, "B": T}, "y": {"A": F, "B": F}}, ["A", "B"])
    assert steady.swing_pp == 0.0 and swing_sentence(steady) == "the score is 50% under every composition: no swing"
    empty = score_swing({"x": {"A": None}}, ["A"])
    assert (empty.n_graded, empty.worst, empty.best, empty.swing_pp) == (0, None, None, None)
    assert empty.per_composition == {"A": None} and empty.low is None


@given(st.dictionaries(st.text(min_size=1, max_size=3),
                       st.one_of(st.just([None] * 3), st.lists(st.booleans(), min_size=3, max_size=3)), max_size=12))
def test_every_composition_scores_between_the_worst_and_the_best_case(raw) -> None:
    """A case is graded under every composition or none (checks and a grader answer for every output)."""
    names = ["A", "B", "C"]
    verdicts = {case: dict(zip(names, vs)) for case, vs in raw.items()}
    s = score_swing(verdicts, names)
    graded = [[v for v in vs if v is not None] for vs in raw.values()]
    graded = [vs for vs in graded if vs]
    assert s.n_graded == len(graded)
    if not graded:
        return
    for rate in s.per_composition.values():
        assert rate is None or s.worst - 1e-12 <= rate <= s.best + 1e-12
    flipping = sum(1 for vs in graded if True in vs and False in vs)
    assert s.swing_pp == pytest.approx(100.0 * flipping / len(graded))
