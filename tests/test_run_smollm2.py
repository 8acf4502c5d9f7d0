"""`flakecheck run` on a SmolLM2 subset of the demo suite (slow; CI runs it): the fix and the flake."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import flakecheck
from flakecheck.data.rundir import RunData
from flakecheck.data.suite import Suite, load_suite
from flakecheck.engine import LoadedModel, load_model

DEMO = Path(__file__).resolve().parents[1] / "suites" / "demo.jsonl"
# Cases of several kinds, some of which diverged under split-K in a full demo run.
IDS = ["qa-16", "write-15", "mc-11", "qa-14", "math-09", "mc-02", "math-02", "qa-01"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model("smollm2", "bfloat16")


@pytest.fixture(scope="module")
def subset() -> Suite:
    suite = load_suite(DEMO).select(IDS)
    return replace(suite, cases=[replace(c, max_tokens=12) for c in suite.cases])


def test_invariant_kernels_make_every_default_composition_bitwise_identical(smollm2, subset, tmp_path) -> None:
    run = flakecheck.run_suite(subset, model=smollm2, kernels="invariant", out=tmp_path / "inv", html=False)
    assert len(run.meta["compositions"]) == 6
    assert run.runs.first_divergence.isna().all()
    per_step = run.tokens.groupby(["case_id", "step"])
    assert (per_step.token_id.nunique() == 1).all()
    assert (per_step.top1_logprob.nunique() == 1).all() and (per_step.top2_logprob.nunique() == 1).all()


def test_invariant_kernels_are_bitwise_in_float32_too(subset, tmp_path) -> None:
    """float32 takes other GEMM paths than bf16 (MKL's sgemm, not FBGEMM), whose rows once depended on the
    batch on AVX-512 CPUs; the logprobs of every composition must still be the same bits."""
    model = load_model("smollm2", "float32")
    run = flakecheck.run_suite(subset, model=model, kernels="invariant", out=tmp_path / "inv32", html=False)
    per_step = run.tokens.groupby(["case_id", "step"])
    assert (per_step.top1_logprob.nunique() == 1).all() and (per_step.top2_logprob.nunique() == 1).all()
    assert run.runs.first_divergence.isna().all()


@pytest.fixture(scope="module")
def splitk_runs(smollm2, subset, tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunData]:
    out = tmp_path_factory.mktemp("splitk")
    return {mode: flakecheck.run_suite(subset, model=smollm2, kernels="splitk", out=out / mode, html=False,
                                       replay=mode) for mode in ("simulated", "physical")}


def test_simulated_replay_is_bitwise_physical_replay_on_smollm2(splitk_runs) -> None:
    """Every default composition at once in shared forward passes gives the traces of replaying each
    alone: token ids, logprobs, top-2, raw logits, statuses."""
    assert splitk_runs["simulated"].meta["replay"] == "simulated"
    assert splitk_runs["physical"].meta["replay"] == "physical"
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(splitk_runs["simulated"], table),
                                      getattr(splitk_runs["physical"], table), check_exact=True)


def test_splitk_kernels_make_some_case_diverge_where_the_tokens_do(splitk_runs) -> None:
    run = splitk_runs["simulated"]
    diverged = run.runs[run.runs.first_divergence.notna()]
    assert len(diverged) > 0
    reference = run.runs[run.runs.composition == run.meta["reference"]].set_index("case_id").token_ids
    for row in diverged.itertuples():
        step = int(row.first_divergence)
        ref, alt = list(reference[row.case_id]), list(row.token_ids)
        assert ref[:step] == alt[:step] and (step == min(len(ref), len(alt)) or ref[step] != alt[step])
