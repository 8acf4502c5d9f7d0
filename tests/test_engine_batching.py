"""Scheduling changes what is computed together, never what a sequence generates (fp32, native ops).

Each request is first generated alone (max batch 1, whole-prompt prefill, no prefix cache): that
is the reference. Ragged batches, chunked prefill, prefix-cache reuse and staggered arrival must
give the same tokens and, within 1e-4, the same top-2 logprobs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flakecheck.engine import Completion, LLMEngine, LoadedModel, Request, SamplingParams, load_model
from flakecheck.engine.prefix_cache import BLOCK_SIZE

TOLERANCE = 1e-4
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request: pytest.FixtureRequest, tiny_model_factory) -> LoadedModel:  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_factory(request.param)), "float32")


def _prompts(model: LoadedModel) -> list[list[int]]:
    """Mixed lengths (1 to 60 tokens), some sharing a long prefix so the prefix cache has work."""
    tok = model.tokenizer
    shared = tok("The capital of France is Paris. The capital of Italy is Rome. What is 2 + 2?")["input_ids"]
    texts = ["def add(a, b):", "A", "Write a haiku about the sea, the wind and the morning light.",
             '{"name": "Ada", "age": 36}', "What is 7 * 6?"]
    prompts = [tok(t)["input_ids"] for t in texts]
    prompts += [shared + tok(t)["input_ids"] for t in (" The answer is", " It is 4.", "")]
    prompts.append(shared * 3)
    assert len({len(p) for p in prompts}) > 5 and min(len(p) for p in prompts) <= 2
    assert max(len(p) for p in prompts) > 3 * BLOCK_SIZE
    return prompts


def _requests(prompts: list[list[int]], arrivals: list[int] | None = None,
              max_tokens: int = MAX_TOKENS) -> list[Request]:
    arrivals = arrivals or [0] * len(prompts)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [Request(i, p, params, arrival) for i, (p, arrival) in enumerate(zip(prompts, arrivals))]


@pytest.fixture(scope="module")
def solo(model: LoadedModel) -> list[Completion]:
    engine = LLMEngine(model, max_num_seqs=1)
    return [engine.generate([r])[0] for r in _requests(_prompts(model))]


def _assert_same_as_solo(got: list[Completion], solo: list[Completion]) -> None:
    assert [c.request_id for c in got] == [c.request_id for c in solo]
    for ours, ref in zip(got, solo):
        assert ours.token_ids == ref.token_ids, f"request {ours.request_id} diverged"
        assert ours.top2_ids == ref.top2_ids
        for a, b in ((ours.top1_logprobs, ref.top1_logprobs), (ours.top2_logprobs, ref.top2_logprobs)):
            assert max(abs(x - y) for x, y in zip(a, b)) <= TOLERANCE


def test_ragged_batch_of_mixed_lengths(model: LoadedModel, solo: list[Completion]) -> None:
    engine = LLMEngine(model, max_num_seqs=16)
    _assert_same_as_solo(engine.generate(_requests(_prompts(model))), solo)
    assert engine.stats.steps == MAX_TOKENS  # all together: one prefill step, then decode steps


def test_chunked_prefill(model: LoadedModel, solo: list[Completion]) -> None:
    engine = LLMEngine(model, max_num_seqs=4, max_num_batched_tokens=7)
    _assert_same_as_solo(engine.generate(_requests(_prompts(model))), solo)


def test_prefix_cache_reuse(model: LoadedModel, solo: list[Completion]) -> None:
    prompts = _prompts(model)
    engine = LLMEngine(model, max_num_seqs=1, enable_prefix_caching=True)
    got = engine.generate(_requests(prompts))
    _assert_same_as_solo(got, solo)
    assert engine.stats.prefix_hit_tokens > 0
    for completion, prompt in zip(got, prompts):
        # only whole blocks, and always at least one prompt token left to compute
        assert completion.cached_prompt_tokens % BLOCK_SIZE == 0
        assert completion.cached_prompt_tokens < len(prompt)


def test_prefix_cache_hit_of_a_repeated_block_aligned_prompt(model: LoadedModel) -> None:
    prompt = list(range(3, 3 + 2 * BLOCK_SIZE))  # exactly two blocks
    engine = LLMEngine(model, max_num_seqs=1, enable_prefix_caching=True)
    first, second = engine.generate(_requests([prompt, prompt]))
    assert first.cached_prompt_tokens == 0
    assert second.cached_prompt_tokens == BLOCK_SIZE  # the last block holds the token to compute
    assert second.token_ids == first.token_ids


def test_staggered_arrival(model: LoadedModel, solo: list[Completion]) -> None:
    prompts = _prompts(model)
    arrivals = [3 * i for i in range(len(prompts))]
    engine = LLMEngine(model, max_num_seqs=3)
    _assert_same_as_solo(engine.generate(_requests(prompts, arrivals)), solo)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_num_seqs=st.integers(1, 12),
    budget=st.one_of(st.none(), st.integers(3, 40)),
    prefix=st.booleans(),
    arrivals=st.lists(st.integers(0, 20), min_size=9, max_size=9),
)
def test_any_schedule_gives_solo_results(model: LoadedModel, solo: list[Completion], max_num_seqs: int,
                                         budget: int | None, prefix: bool, arrivals: list[int]) -> None:
    engine = LLMEngine(model, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                       enable_prefix_caching=prefix)
    _assert_same_as_solo(engine.generate(_requests(_prompts(model), arrivals)), solo)


def test_reconfigure_keeps_results(model: LoadedModel, solo: list[Completion]) -> None:
    engine = LLMEngine(model, max_num_seqs=1)
    engine.reconfigure(max_num_seqs=5, max_num_batched_tokens=9, enable_prefix_caching=True)
    _assert_same_as_solo(engine.generate(_requests(_prompts(model))), solo)
    engine.reconfigure(max_num_seqs=2)
    _assert_same_as_solo(engine.generate(_requests(_prompts(model))), solo)


def test_stop_on_eos_and_on_max_tokens(model: LoadedModel, solo: list[Completion]) -> None:
    reference = solo[0]
    stop_token = reference.token_ids[3]
    first = reference.token_ids.index(stop_token)
    engine = LLMEngine(model, max_num_seqs=4)
    engine.eos_token_ids = frozenset({stop_token})
    prompts = _prompts(model)
    stopped = engine.generate([Request("eos", prompts[0], SamplingParams(max_tokens=MAX_TOKENS))])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == reference.token_ids[: first + 1]
    ignored = engine.generate([Request("ign", prompts[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))])[0]
    assert ignored.finish_reason == "length" and ignored.token_ids == reference.token_ids
    short = engine.generate([Request("short", prompts[0], SamplingParams(max_tokens=2, ignore_eos=True))])[0]
    assert short.finish_reason == "length" and short.token_ids == reference.token_ids[:2]


def test_step_api_and_request_order(model: LoadedModel, solo: list[Completion]) -> None:
    engine = LLMEngine(model, max_num_seqs=4)
    requests = _requests(_prompts(model))
    for request in reversed(requests):
        engine.add_request(request)
    finished: dict[object, Completion] = {}
    while engine.has_unfinished():
        for completion in engine.step():
            assert completion.request_id not in finished
            finished[completion.request_id] = completion
    _assert_same_as_solo([finished[r.request_id] for r in requests], solo)
    seen: list[object] = []
    engine.generate(list(reversed(requests)), on_finish=lambda c: seen.append(c.request_id))
    assert sorted(seen) == sorted(r.request_id for r in requests)


def test_request_longer_than_the_context_is_refused(model: LoadedModel) -> None:
    engine = LLMEngine(model)
    too_long = model.config.max_context
    with pytest.raises(ValueError, match="context"):
        engine.add_request(Request("x", [3] * too_long, SamplingParams(max_tokens=1)))


def test_model_path_is_a_path(model: LoadedModel) -> None:
    assert isinstance(model.path, Path) and (model.path / "config.json").is_file()
