"""Mixtures of experts (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE with a dense layer, OLMoE) on tiny
random models from transformers' own config classes (parity with transformers: tests/test_engine_parity.py):
an expert's matmul order follows the rows its own step routed to it, however many steps share a forward pass;
under `invariant` a request's tokens and logprobs are bitwise the same solo, batched, chunked and behind a
prefix-cache hit; under `splitk` the batch moves them; the self-check passes for the experts' shapes; simulated
replay gives bitwise the traces of replaying each composition alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flakecheck.engine import Request, load_model
from flakecheck.engine.models import model_dims, probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels import BatchLayout, Segment, StepShape
from flakecheck.kernels.policy import parse_policy, plan_step
from tests.test_model_families import QUESTIONS as FAMILY_QUESTIONS
from tests.test_model_families import _requests as requests_for
from tests.test_model_families import (
    assert_invariant_in_every_composition,
    assert_simulated_is_physical,
    assert_splitk_moves,
)

MOE = ("mixtral", "qwen2-moe", "qwen3-moe", "olmoe")
QUESTIONS = FAMILY_QUESTIONS[:3]
TOKENS = 6


@pytest.fixture(scope="module", params=MOE)
def family(request: pytest.FixtureRequest, tiny_model_factory):  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_factory(request.param)), "bfloat16")


def _requests(model) -> list[Request]:  # type: ignore[no-untyped-def]
    return requests_for(model, QUESTIONS, TOKENS)


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
    assert_invariant_in_every_composition(family, _requests(family))


@pytest.mark.parametrize("architecture", MOE)
def test_splitk_moves_the_numbers_with_the_batch(architecture: str, tiny_wide_factory) -> None:
    model = load_model(str(tiny_wide_factory(architecture)), "bfloat16")
    assert_splitk_moves(model, _requests(model))


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
    assert_simulated_is_physical(load_model(str(tiny_wide_factory("mixtral")), "bfloat16"), QUESTIONS, 5, tmp_path)
