"""Engine level: under the invariant policy a request's tokens and logprobs are bitwise identical
whatever it is batched with; under splitk the same request's logprobs change with the batch."""

from __future__ import annotations

import pytest
import torch

from flakecheck.engine.llm_engine import LLMEngine, Request, encode_prompt
from flakecheck.engine.loader import load_model
from flakecheck.engine.sequence import Completion, SamplingParams
from tests.machine_paths import engine_ops

QUESTIONS = [
    "What is the capital of France? Answer in one word, then explain why in a sentence or two.",
    "2 + 2?",
    "Write a haiku about the sea, the wind and the morning light over the water.",
    "def add(a, b):",
    "Name the city.",
    "Answer with a single letter: A, B, C or D. Which one is the second letter of the alphabet?",
    '{"name": "Ada", "age": 36}',
    "What is 7 * 6?",
]
TOKENS = 12


def _prompts(model) -> list[list[int]]:
    return [encode_prompt(model, [{"role": "user", "content": q}]) for q in QUESTIONS]


def _run(model, ops, requests: list[Request], **engine_args) -> dict[object, Completion]:
    engine = LLMEngine(model, ops, **{"max_num_seqs": max(1, len(requests)), **engine_args})
    return {c.request_id: c for c in engine.generate(requests)}


def _fingerprint(c: Completion) -> tuple:
    return (c.token_ids, c.top1_ids, c.top1_logprobs, c.top2_ids, c.top2_logprobs)


@pytest.fixture(scope="module", params=[("llama", "bfloat16"), ("llama", "float32"), ("qwen3", "bfloat16")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def tiny(request, tiny_model_factory):
    arch, dtype = request.param
    return load_model(str(tiny_model_factory(arch)), dtype)


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, ignore_eos=True)


@pytest.mark.parametrize("position", [0, 5])
def test_invariant_request_is_identical_in_any_composition(tiny, position: int) -> None:
    ops = engine_ops("invariant", tiny.config)
    prompts = _prompts(tiny)
    target = prompts[0]
    alone = _fingerprint(_run(tiny, ops, [Request("t", target, _params())])["t"])
    others = [Request(i, p, _params()) for i, p in enumerate(prompts[1:])]
    mixed = others[:position] + [Request("t", target, _params())] + others[position:]
    staggered = [Request(r.request_id, r.prompt_ids, r.params, arrival=(3 * i) % 7) for i, r in enumerate(mixed)]
    compositions = {
        "batch of 8": (mixed, {}),
        "chunked prefill (7 tokens a step)": (mixed, {"max_num_batched_tokens": 7}),
        "batch of 3": (mixed[:3] if position == 0 else mixed[position - 2 : position + 1], {}),
        "staggered arrival": (staggered, {"max_num_batched_tokens": 16}),
    }
    for name, (requests, engine_args) in compositions.items():
        got = _fingerprint(_run(tiny, ops, requests, **engine_args)["t"])
        assert got == alone, f"invariant policy: request changed under {name}"


def test_invariant_request_is_identical_with_a_prefix_cache_hit(tiny) -> None:
    ops = engine_ops("invariant", tiny.config)
    target = _prompts(tiny)[0]
    alone = _fingerprint(_run(tiny, ops, [Request("t", target, _params())])["t"])
    engine = LLMEngine(tiny, ops, max_num_seqs=2, enable_prefix_caching=True)
    engine.generate([Request("warm", target[:-3] + target[-3:-1][::-1], _params())])  # shares the prefix
    hit = engine.generate([Request("t", target, _params())])[0]
    assert hit.cached_prompt_tokens > 0, "the prefix cache should have served part of the prompt"
    assert _fingerprint(hit) == alone


def test_invariant_decode_logprobs_equal_teacher_forced_prefill(tiny) -> None:
    ops = engine_ops("invariant", tiny.config)
    target = _prompts(tiny)[3]
    decoded = _run(tiny, ops, [Request("t", target, _params())])["t"]
    for k in (1, 5, TOKENS - 1):  # prefill the prompt plus k generated tokens, predict token k+1
        forced = _run(tiny, ops, [Request("f", target + decoded.token_ids[:k], SamplingParams(1, True))])["f"]
        assert forced.top1_ids[0] == decoded.top1_ids[k]
        assert forced.top1_logprobs[0] == decoded.top1_logprobs[k]
        assert forced.top2_logprobs[0] == decoded.top2_logprobs[k]


@pytest.mark.parametrize("policy", ["native", "splitk", "invariant"])
def test_every_policy_runs_the_engine_end_to_end(tiny, policy: str) -> None:
    ops = engine_ops(policy, tiny.config)
    prompts = _prompts(tiny)[:4]
    done = _run(tiny, ops, [Request(i, p, _params()) for i, p in enumerate(prompts)], max_num_batched_tokens=9)
    assert sorted(done) == list(range(4))
    for c in done.values():
        assert len(c.token_ids) == TOKENS
        assert all(lp <= 0.0 and lp2 <= lp for lp, lp2 in zip(c.top1_logprobs, c.top2_logprobs))


# ---------------------------------------------------------------------------------------------
# the default model


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return load_model("smollm2", "bfloat16")


SMOL_QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn.", "What is 12 * 7?",
                  "Explain gravity to a child in one sentence."]


@pytest.mark.slow
def test_smollm2_invariant_identical_and_splitk_varies(smollm2) -> None:
    prompts = [encode_prompt(smollm2, [{"role": "user", "content": q}]) for q in SMOL_QUESTIONS]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    batch = [Request(i, p, params) for i, p in enumerate(prompts)]
    alone = Request(0, prompts[0], params)

    inv = engine_ops("invariant", smollm2.config)
    ref = _fingerprint(_run(smollm2, inv, [alone])[0])
    assert _fingerprint(_run(smollm2, inv, batch)[0]) == ref
    assert _fingerprint(_run(smollm2, inv, batch[::-1], max_num_batched_tokens=13)[0]) == ref

    sk = engine_ops("splitk", smollm2.config)
    sk_alone = _run(smollm2, sk, [alone])[0]
    sk_batch = _run(smollm2, sk, batch)[0]
    assert _fingerprint(_run(smollm2, sk, batch)[0]) == _fingerprint(sk_batch), "same composition, same bits"
    assert sk_alone.top1_logprobs != sk_batch.top1_logprobs, "splitk should change logprobs with the batch"
