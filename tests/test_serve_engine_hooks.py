"""The engine methods the server needs: progress() of an unfinished request, abort(), cache salts."""

from __future__ import annotations

import pytest

from flakecheck.engine import LLMEngine, LoadedModel, Request, SamplingParams, encode_prompt, load_model
from flakecheck.engine.prefix_cache import BLOCK_SIZE


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> LoadedModel:  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_dir), "float32")


def _prompt(model: LoadedModel, text: str) -> list[int]:
    return encode_prompt(model, [{"role": "user", "content": text}])


def _params(n: int = 10) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def test_progress_is_a_prefix_of_the_completion(model: LoadedModel) -> None:
    engine = LLMEngine(model, max_num_seqs=2)
    engine.add_request(Request("a", _prompt(model, "What is 2 + 2?"), _params()))
    seen = []
    finished = []
    while engine.has_unfinished():
        finished += engine.step()
        partial = engine.progress("a")
        if partial is not None:
            seen.append(partial.token_ids)
    assert engine.progress("a") is None and engine.progress("unknown") is None
    [done] = finished
    assert [len(s) for s in seen] == list(range(1, 10))
    assert all(done.token_ids[: len(s)] == s for s in seen)


def test_abort_frees_the_slot_and_leaves_the_others_unchanged(model: LoadedModel) -> None:
    a, b, c = (_prompt(model, t) for t in ("What is 2 + 2?", "Name the city.", "def add(a, b):"))
    alone = LLMEngine(model, max_num_seqs=1).generate([Request("b", b, _params())])[0]
    engine = LLMEngine(model, max_num_seqs=1)  # one slot: b and c wait until a is gone
    for rid, prompt in (("a", a), ("b", b), ("c", c)):
        engine.add_request(Request(rid, prompt, _params()))
    engine.step()
    engine.step()
    cut = engine.abort("a", "stop")
    assert cut is not None and cut.finish_reason == "stop" and len(cut.token_ids) == 2
    waiting = engine.abort("c")
    assert waiting is not None and waiting.token_ids == [] and waiting.finish_reason == "abort"
    assert engine.abort("a") is None
    finished = []
    while engine.has_unfinished():
        finished += engine.step()
    assert [f.request_id for f in finished] == ["b"]
    assert finished[0].token_ids == alone.token_ids and finished[0].top2_logprobs == alone.top2_logprobs


def test_requests_with_other_cache_salts_never_share_prefix_blocks(model: LoadedModel) -> None:
    prompt = _prompt(model, "The capital of France is Paris. The capital of Italy is Rome. " * 2)
    assert len(prompt) > 2 * BLOCK_SIZE
    engine = LLMEngine(model, max_num_seqs=1, enable_prefix_caching=True)

    def cached(salt: str | None) -> int:
        return engine.generate([Request(object(), prompt, _params(2), cache_salt=salt)])[0].cached_prompt_tokens

    assert cached("alice") == 0
    assert cached("alice") > 0
    assert cached("bob") == 0
    assert cached(None) == 0
    assert cached(None) > 0
