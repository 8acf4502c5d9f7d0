"""The real default model, SmolLM2-135M-Instruct in bf16 (slow: CI still runs these)."""

from __future__ import annotations

import math

import pytest

from flakecheck.engine import LLMEngine, Request, SamplingParams, decode_tokens, encode_prompt, load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():  # type: ignore[no-untyped-def]
    return load_model("smollm2", "bfloat16")


@pytest.fixture(scope="module")
def engine(smollm2) -> LLMEngine:  # type: ignore[no-untyped-def]
    return LLMEngine(smollm2)  # built once: packing the weights takes seconds


def test_capital_of_france(smollm2, engine: LLMEngine) -> None:  # type: ignore[no-untyped-def]
    prompt = encode_prompt(smollm2, [{"role": "user", "content": "What is the capital of France?"}])
    engine.reconfigure(max_num_seqs=1)
    completion = engine.generate([Request("france", prompt, SamplingParams(max_tokens=24))])[0]
    assert "Paris" in decode_tokens(smollm2, completion.token_ids)
    assert len(completion.top1_logprobs) == len(completion.top2_logprobs) == len(completion.token_ids)
    for top1, top2 in zip(completion.top1_logprobs, completion.top2_logprobs):
        assert math.isfinite(top1) and math.isfinite(top2)
        assert 0.0 >= top1 >= top2
    assert completion.top1_ids == completion.token_ids  # greedy
    assert all(a != b for a, b in zip(completion.top1_ids, completion.top2_ids))


def test_chat_template_survives_the_gguf_cache(smollm2) -> None:  # type: ignore[no-untyped-def]
    """The cached safetensors directory keeps the GGUF's tokenizer and chat template."""
    assert smollm2.tokenizer.chat_template
    tok = smollm2.tokenizer
    ids = encode_prompt(smollm2, [{"role": "user", "content": "Hi"}])
    text = tok.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert tok.convert_tokens_to_ids("<|im_end|>") in smollm2.eos_token_ids


def test_second_load_uses_the_cache(smollm2) -> None:  # type: ignore[no-untyped-def]
    again = load_model("smollm2", "bfloat16")
    assert again.from_cache is True
    assert again.path == smollm2.path and (again.path / "model.safetensors").is_file()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert again.weights[name].equal(smollm2.weights[name])


def test_batch_of_chats_answers_every_request(smollm2, engine: LLMEngine) -> None:  # type: ignore[no-untyped-def]
    """bf16 batching may flip near-ties (that is what flakecheck measures), but a batch still
    answers every request, with the requested lengths, in request order."""
    questions = ["What is 2 + 2?", "Name a colour.", "What is the capital of Italy?"]
    prompts = [encode_prompt(smollm2, [{"role": "user", "content": q}]) for q in questions]
    requests = [Request(i, p, SamplingParams(max_tokens=6, ignore_eos=True)) for i, p in enumerate(prompts)]
    engine.reconfigure(max_num_seqs=3)
    got = engine.generate(requests)
    assert [c.request_id for c in got] == [0, 1, 2]
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in got)
