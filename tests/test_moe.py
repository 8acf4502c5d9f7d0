"""Mixtures of experts (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE with a dense layer, OLMoE) on tiny
random models from transformers' own config classes (parity with transformers: tests/test_engine_parity.py):
an expert's matmul order follows the rows its own step routed to it, however many steps share a forward pass;
under `invariant` a request's tokens and logprobs are bitwise the same solo, batched, chunked and behind a
prefix-cache hit; under `splitk` the batch moves them; the self-check passes for the experts' shapes; simulated
replay gives bitwise the traces of replaying each composition alone."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt, load_model
from flakecheck.engine.models import model_dims, probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels import BatchLayout, Segment, StepShape
from flakecheck.kernels.policy import parse_policy, plan_step
from tests.machine_paths import engine_ops

MOE = ("mixtral", "qwen2-moe", "qwen3-moe", "olmoe")
QUESTIONS = [
    "What is the capital of France? Answer in one word, then explain why in a sentence or two.",
    "2 + 2?",
    "Write a haiku about the sea, the wind and the morning light over the water.",
]
TOKENS = 6


@pytest.fixture(scope="module", params=MOE)
def family(request: pytest.FixtureRequest, tiny_model_factory):  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_factory(request.param)), "bfloat16")


def _requests(model) -> list[Request]:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True)
    return [Request(i, encode_prompt(model, [{"role": "user", "content": q}]), params)
            for i, q in enumerate(QUESTIONS)]


def _fingerprints(model, ops, requests, **engine_args) -> dict:  # type: ignore[no-untyped-def]
    engine = LLMEngine(model, ops, **{"max_num_seqs": len(requests), **engine_args})
    return {c.request_id: (c.token_ids, c.top1_logprobs, c.top2_ids, c.top2_logprobs)
            for c in engine.generate(requests)}


def test_an_experts_rows_follow_their_own_steps_routed_count(tiny_wide_factory) -> None:
    """Two steps in one forward pass: each step's rows routed to an expert take the order that step's count gives,
    the same groups as when the step runs alone."""
    config = load_model(str(tiny_wide_factory("mixtral")), "bfloat16").config
    dims = model_dims(config)
    policy = parse_policy("splitk")
    solo = plan_step(policy, StepShape((40,), (40,), 1), dims, 132)
    other = plan_step(policy, StepShape((1, 1), (50, 60), 2), dims, 132)
    _, (n, k) = dims.experts  # the down projection: K = 768
    rule = solo.experts
    assert rule is not None and rule.order(3, n, k) != rule.order(30, n, k), "the rule should follow the count"
    routed = torch.tensor([*range(0, 30), 40])  # 30 rows of the first step, 1 of the second
    shared = BatchLayout([Segment((0, 40), (0, 1), (0, 1), solo), Segment((40, 42), (1, 3), (1, 3), other)], 42, 3)
    assert shared.routed(routed, n, k) == ((rule.order(1, n, k), slice(30, 31)), (rule.order(30, n, k), slice(0, 30))) \
        or shared.routed(routed, n, k) == ((rule.order(30, n, k), slice(0, 30)), (rule.order(1, n, k), slice(30, 31)))
    alone = BatchLayout([Segment((0, 40), (0, 1), (0, 1), solo)], 40, 1)
    assert alone.routed(routed[:30], n, k) == ((rule.order(30, n, k), slice(0, 30)),)


def test_invariant_is_bitwise_in_every_composition(family) -> None:
    ops = engine_ops("invariant", family.config)
    requests = _requests(family)
    solo = {}
    for r in requests:
        solo.update(_fingerprints(family, ops, [r]))
    compositions = {
        "batched": (requests, {}),
        "batched, reversed": (requests[::-1], {}),
        "chunked prefill (7 tokens a step)": (requests, {"max_num_batched_tokens": 7}),
    }
    for name, (batch, args) in compositions.items():
        assert _fingerprints(family, ops, batch, **args) == solo, f"invariant: changed under {name}"
    engine = LLMEngine(family, ops, max_num_seqs=2, enable_prefix_caching=True)
    target = requests[0]
    engine.generate([Request("warm", target.prompt_ids[:-2] + [target.prompt_ids[-1]], target.params)])
    hit = engine.generate([target])[0]
    assert hit.cached_prompt_tokens > 0
    assert (hit.token_ids, hit.top1_logprobs, hit.top2_ids, hit.top2_logprobs) == solo[target.request_id]


@pytest.mark.parametrize("architecture", MOE)
def test_splitk_moves_the_numbers_with_the_batch(architecture: str, tiny_wide_factory) -> None:
    model = load_model(str(tiny_wide_factory(architecture)), "bfloat16")
    ops = engine_ops("splitk", model.config)
    requests = _requests(model)
    solo = {}
    for r in requests:
        solo.update(_fingerprints(model, ops, [r]))
    batched = _fingerprints(model, ops, requests, max_num_batched_tokens=7)
    assert _fingerprints(model, ops, requests, max_num_batched_tokens=7) == batched, "same composition, same bits"
    assert batched != solo, "split-K kernels should change some logprob with the batch"


def test_self_check_passes_for_the_experts_shapes(family) -> None:
    dims = probe_dims(family.config)
    assert set(model_dims(family.config).experts) <= set(dims.projections)
    for policy in ("invariant", "splitk"):
        spec = resolve_engine(EngineSettings(dtype="bfloat16", policy=parse_policy(policy)), dims)
        assert not spec.verification.refused
        assert spec.simulated


def test_simulated_replay_is_physical_replay(tiny_wide_factory, tmp_path: Path) -> None:
    """Mixtral under split-K (its experts' down projection splits K=768 in 12 or 8 by the rows routed to it): a
    row's expert order follows its own composition's routed counts in shared passes."""
    model = load_model(str(tiny_wide_factory("mixtral")), "bfloat16")
    suite = tmp_path / "s.jsonl"
    suite.write_text("".join(json.dumps({"id": f"q{i}", "input": q, "max_tokens": 5}) + "\n"
                             for i, q in enumerate(QUESTIONS)))
    compositions = [Composition("solo"), Composition("batch4", max_batch=4),
                    Composition("chunked", max_batch=4, chunk=7), Composition("prefix", prefix_cache=True)]
    runs = {mode: flakecheck.run_suite(suite, model=model, out=tmp_path / mode, html=False, replay=mode,
                                       kernels="splitk", compositions=compositions)
            for mode in ("physical", "simulated")}
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(runs["physical"], table), getattr(runs["simulated"], table),
                                      check_exact=True)
