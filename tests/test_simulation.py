"""Simulated replay (every composition at once, in shared forward passes) gives bitwise the traces of
replaying each composition alone: token ids, logprobs, top-2 — for every case and composition."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import flakecheck
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition, Fillers
from flakecheck.engine import LoadedModel, load_model
from flakecheck.errors import UserError
from tests.test_run import QUESTIONS

SYSTEM = "You are a terse assistant. Answer in as few words as you can."
# Every axis the lockstep has to get right: the default set (serial reference, batches, chunked
# prefill, serial prefix cache, staggered fillers), and serial chunking, a serial prefix cache with
# chunks, a batched and shuffled prefix cache, fillers that arrive with the cases.
COMPOSITIONS = [*DEFAULT_COMPOSITIONS,
                Composition("serial-chunk", chunk=7),
                Composition("serial-prefix-chunk", prefix_cache=True, chunk=9),
                Composition("b4-prefix", max_batch=4, prefix_cache=True, order_seed=3),
                Composition("b6-fillers", max_batch=6, fillers=Fillers(count=5, prompt_len=(3, 40)))]


def write_suite(path: Path) -> Path:
    """Cases of varied lengths; most share a system prompt, so prefix caches hit across cases."""
    lines = []
    for i, q in enumerate(QUESTIONS):
        messages = [{"role": "user", "content": q * (1 + i % 3)}]
        if i % 3 != 2:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        lines.append(json.dumps({"id": f"q{i}", "input": messages, "max_tokens": 4 + i % 5}))
    lines.append(json.dumps({"id": "short", "prompt": "Hi", "max_tokens": 3}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("sim") / "sim.jsonl")


@pytest.fixture(scope="module")
def wide(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def both(model: LoadedModel, suite: Path, out: Path, **options):
    runs = {mode: flakecheck.run_suite(suite, model=model, out=out / mode, html=False, replay=mode, **options)
            for mode in ("physical", "simulated")}
    return runs["physical"], runs["simulated"]


def assert_same_traces(physical, simulated) -> None:
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(physical, table), getattr(simulated, table), check_exact=True)


@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_simulated_replay_is_bitwise_physical_replay(wide, suite, tmp_path, kernels) -> None:
    physical, simulated = both(wide, suite, tmp_path, kernels=kernels, compositions=COMPOSITIONS, repeat=2)
    assert_same_traces(physical, simulated)
    assert len(simulated.runs) == len(COMPOSITIONS) * 2 * 11
    if kernels == "splitk":  # the property is not vacuous: the compositions do change some tokens
        assert simulated.runs.first_divergence.notna().any()
    # ... and rows that several compositions compute alike were computed once (shared prompts, repeats)
    assert simulated.meta["replay_stats"]["shared_rows"] > 0
    # ... and fillers shaped their steps without being computed
    assert simulated.meta["replay_stats"]["skipped_rows"] > 0


def test_simulated_replay_of_a_model_with_per_head_norms(tiny_model_factory, suite, tmp_path) -> None:
    """Qwen3's q/k norms reduce rows per head: their split plans too follow each step's shape."""
    model = load_model(str(tiny_model_factory("qwen3")), "bfloat16")
    compositions = [Composition("solo"), Composition("b4", max_batch=4), Composition("prefix", prefix_cache=True)]
    assert_same_traces(*both(model, suite, tmp_path, kernels="matmul=invariant,attention=splitk,norm=splitk",
                             compositions=compositions))


def test_native_kernels_are_never_simulated(wide, suite, tmp_path) -> None:
    with pytest.raises(UserError, match="physical"):
        flakecheck.run_suite(suite, model=wide, kernels="native", replay="simulated", out=tmp_path / "n")
    auto = flakecheck.run_suite(suite, model=wide, kernels="native", compositions=[Composition("solo")],
                                out=tmp_path / "auto", html=False, max_tokens=2)
    assert auto.meta["replay"] == "physical"
