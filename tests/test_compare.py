"""`flakecheck compare` on run directories built by hand, with the AUROC worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.data.rundir import RunDirectory, load_run
from flakecheck.reports.compare import auroc, compare_runs
from tests.test_run import run_cli


def make_run(path: Path, cases: dict[str, tuple[str, float, int | None]], source: str = "engine") -> Path:
    """A run directory whose cases.parquet holds (status, risk, first_divergence) per case id."""
    rows = [{"case_id": case_id, "status": status, "n_compositions": 2, "n_distinct_outputs": 1 + (step is not None),
             "first_divergence": step, "divergence_composition": "b" if step is not None else None,
             "ref_token": None, "alt_token": None, "gap_at_divergence": None, "min_gap": 0.1, "n_near_ties": 0,
             "pass_rate": None, "verdict_flip": status == "verdict_flaky", "risk": risk}
            for case_id, (status, risk, step) in cases.items()]
    directory = RunDirectory(path)
    directory.write_tables([], [], rows)
    directory.write_meta({"source": source, "model": "m", "policy": "splitk", "suite_sha256": "abc",
                          "compositions": [{"name": "solo"}, {"name": "b"}]})
    return path


# A's risk for five cases, and whether B saw each diverge:
#   risk 0.9 (B: diverged), 0.8 (no), 0.3 (diverged), 0.3 (no), 0.1 (no)
# positives {0.9, 0.3}, negatives {0.8, 0.3, 0.1}: of the 6 pairs, 0.9 beats all three (3), 0.3 loses to
# 0.8 (0), ties 0.3 (0.5), beats 0.1 (1): AUROC = 4.5 / 6 = 0.75.
A = {"c1": ("flaky", 0.9, 3), "c2": ("verdict_flaky", 0.8, 5), "c3": ("fragile", 0.3, None),
     "c4": ("stable", 0.3, None), "c5": ("stable", 0.1, None), "only-a": ("flaky", 0.5, 1)}
B = {"c1": ("flaky", 0.0, 3), "c2": ("stable", 0.0, None), "c3": ("verdict_flaky", 0.0, 7),
     "c4": ("fragile", 0.0, None), "c5": ("stable", 0.0, None), "only-b": ("stable", 0.0, None)}


def test_auroc_by_hand_with_ties_and_the_one_class_case() -> None:
    assert auroc([0.9, 0.8, 0.3, 0.3, 0.1], [True, False, True, False, False]).value == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [True, False]).value == 0.5
    assert auroc([0.1, 0.9], [True, False]).value == 0.0
    for labels in ([True, True], [False, False]):
        result = auroc([0.2, 0.7], labels)
        assert result.value is None and "undefined" in (result.undefined_reason or "")


def test_compare_counts_auroc_steps_and_unmatched_cases(tmp_path: Path) -> None:
    result = compare_runs(load_run(make_run(tmp_path / "a", A)), load_run(make_run(tmp_path / "b", B, "probe")))
    assert result.n_common == 5 and result.only_in_a == ["only-a"] and result.only_in_b == ["only-b"]
    # diverged in A: c1, c2; in B: c1, c3
    assert result.counts == {"both": 1, "a_only": 1, "b_only": 1, "neither": 2}
    assert result.auroc.value == pytest.approx(0.75) and (result.auroc.n_positive, result.auroc.n_negative) == (2, 3)
    assert (result.first_divergence.n_both, result.first_divergence.exact) == (1, 1)
    assert result.first_divergence.median_abs_diff == 0.0
    categories = {c["case_id"]: c["category"] for c in result.cases}
    assert categories == {"c1": "both", "c2": "a_only", "c3": "b_only", "c4": "neither", "c5": "neither"}


def test_first_divergence_agreement_median(tmp_path: Path) -> None:
    a = {f"c{i}": ("flaky", 1.0, step) for i, step in enumerate([2, 4, 10, 0])}
    b = {f"c{i}": ("flaky", 1.0, step) for i, step in enumerate([2, 7, 4, 0])}
    result = compare_runs(load_run(make_run(tmp_path / "a", a)), load_run(make_run(tmp_path / "b", b)))
    # |differences| = 0, 3, 6, 0: two exact, median 1.5; every case diverged in B: AUROC undefined
    assert (result.first_divergence.n_both, result.first_divergence.exact) == (4, 2)
    assert result.first_divergence.median_abs_diff == 1.5 and result.auroc.value is None


def test_compare_cli_json_and_terminal(tmp_path: Path, capfd) -> None:
    a, b = make_run(tmp_path / "a", A), make_run(tmp_path / "b", B, "probe")
    code, output = run_cli(["compare", str(a), str(b), "--json"], capfd)
    data = json.loads(output)
    assert code == 0 and data["auroc"]["value"] == pytest.approx(0.75) and data["only_in_b"] == ["only-b"]
    code, output = run_cli(["compare", str(a), str(b)], capfd)
    assert code == 0 and "0.750" in output and "only in A (1): only-a" in output
    assert "diverged in one run only (2, 2 shown)" in output and "verdict_flaky" in output


def test_compare_bad_inputs_exit_2(tmp_path: Path, capfd) -> None:
    a = make_run(tmp_path / "a", A)
    other = make_run(tmp_path / "other", {"x": ("stable", 0.0, None)})
    (tmp_path / "empty").mkdir()
    for argv in (["compare", str(a), str(tmp_path / "missing")], ["compare", str(a), str(tmp_path / "empty")],
                 ["compare", str(a), str(other)], ["compare", str(a)]):
        code, output = run_cli(argv, capfd)
        assert code == 2, (argv, output)
        assert "Traceback" not in output


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.37, 0.5, 1.0]), st.booleans()), min_size=2, max_size=30))
def test_auroc_is_the_pair_count_and_flips_with_the_score(pairs) -> None:
    scores, labels = [s for s, _ in pairs], [y for _, y in pairs]
    result = auroc(scores, labels)
    pos = [s for s, y in pairs if y]
    neg = [s for s, y in pairs if not y]
    if not pos or not neg:
        assert result.value is None
        return
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    assert result.value == pytest.approx(wins / (len(pos) * len(neg)))
    assert result.value + auroc([-s for s in scores], labels).value == pytest.approx(1.0)
