"""The probe's parts without a server: answer shapes, token ids, retries, load levels, the key scrub."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.errors import UserError
from flakecheck.probe.client import RequestFailed, ServerClient
from flakecheck.probe.endpoint import Endpoint, redact
from flakecheck.probe.levels import filler, make_levels, parse_concurrency
from flakecheck.probe.parse import AnswerError, parse_answer
from flakecheck.probe.retries import RetryPolicy, next_wait, retry_after_s
from flakecheck.probe.vocab import Vocab


def chat_body(content: list[dict], text: str = "hi") -> dict:
    return {"choices": [{"message": {"content": text}, "finish_reason": "length", "logprobs": {"content": content}}],
            "system_fingerprint": "fp1", "model": "m"}


def test_chat_shape_top2_and_tie_order() -> None:
    body = chat_body([
        {"token": " a", "logprob": -0.5, "bytes": [32, 97],
         "top_logprobs": [{"token": " b", "logprob": -0.5, "bytes": [32, 98]},
                          {"token": " a", "logprob": -0.5, "bytes": [32, 97]}]},
        {"token": " c", "logprob": -1.0, "top_logprobs": [{"token": " c", "logprob": -1.0},
                                                          {"token": " d", "logprob": -1.7}]},
    ])
    answer = parse_answer(body, "chat")
    assert answer.text == "hi" and answer.system_fingerprint == "fp1" and len(answer.steps) == 2
    (first, lp1), second = answer.steps[0].top2()
    # an exact tie: the token the server chose ranks first
    assert first.text == " a" and second is not None and second[0].text == " b" and lp1 == second[1]
    (first, lp1), second = answer.steps[1].top2()
    assert (first.text, lp1) == (" c", -1.0) and second == (answer.steps[1].alternatives[1][0], -1.7)


def test_legacy_completions_with_vllm_token_id_placeholders() -> None:
    body = {"choices": [{"text": "xy", "finish_reason": "stop", "logprobs": {
        "tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"token_id:7": -0.1, "token_id:3": -2.5}, {"token_id:9": -0.2, "token_id:4": -float("inf")}],
    }}]}
    answer = parse_answer(body, "completions")
    assert [s.token.id for s in answer.steps] == [7, 9]
    (_, _), second = answer.steps[1].top2()
    assert second is not None and second[0].id == 4 and second[1] == -9999.0  # -inf floored like vLLM


def test_a_placeholder_with_the_real_bytes_keeps_them() -> None:
    body = chat_body([{"token": "token_id:5", "logprob": -0.1, "bytes": [32, 120],
                       "top_logprobs": [{"token": "token_id:6", "logprob": -2.0, "bytes": list(b"token_id:6")}]}])
    step = parse_answer(body, "chat").steps[0]
    assert (step.token.id, step.token.raw) == (5, b" x") and step.alternatives[0][0].raw is None


def test_llamacpp_completions_content_shape_uses_its_ids() -> None:
    body = {"choices": [{"text": "€", "finish_reason": "length", "logprobs": {"content": [
        {"id": 11, "token": "", "bytes": [226, 130], "logprob": -0.3,
         "top_logprobs": [{"id": 11, "token": "", "bytes": [226, 130], "logprob": -0.3},
                          {"id": 12, "token": "x", "bytes": [120], "logprob": -0.9}]},
    ]}}]}
    answer = parse_answer(body, "completions")
    assert answer.steps[0].token.id == 11 and answer.steps[0].token.raw == b"\xe2\x82"


@pytest.mark.parametrize("body, needle", [
    ({"choices": [{"message": {"content": "x"}, "logprobs": None}]}, "no logprobs"),
    ({"choices": [{"message": {"content": "x"}}]}, "no logprobs"),
    ({"result": "x"}, "not an OpenAI-compatible"),
    ([], "JSON object"),
    ({"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"token": "a", "logprob": "high",
                                                                          "top_logprobs": []}]}}]}, "numeric"),
])
def test_answers_that_are_not_usable_are_named(body, needle: str) -> None:
    with pytest.raises(AnswerError, match=needle):
        parse_answer(body, "chat")


def test_interned_ids_and_byte_exact_decoding() -> None:
    from flakecheck.probe.parse import TokenRef

    vocab = Vocab()
    a, b, c = TokenRef(None, "\ufffd", b"\xe2\x82"), TokenRef(None, "\ufffd", b"\xac"), TokenRef(None, " x", None)
    ids = [vocab.id_of(a), vocab.id_of(b), vocab.id_of(c), vocab.id_of(a)]
    assert ids == [0, 1, 2, 0]  # same bytes, same id; different bytes with the same text stay apart
    assert vocab.decode(ids[:2]) == "€" and vocab.text(2) == " x"
    again = Vocab.from_json(vocab.to_json())
    assert again.id_of(TokenRef(None, " x", None)) == 2 and again.decode([0, 1]) == "€"
    with pytest.raises(AnswerError):
        vocab.id_of(TokenRef(5, "token_id:5"))


def test_placeholder_ids_wait_for_their_text() -> None:
    from flakecheck.probe.parse import TokenRef

    vocab = Vocab()
    assert vocab.id_of(TokenRef(42, "token_id:42")) == 42
    assert vocab.needs_text() == [42] and vocab.text(42) == "token_id:42"
    vocab.set_text(42, " hello")
    assert vocab.needs_text() == [] and vocab.text(42) == " hello"


def test_backoff_is_bounded_jittered_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=4, base_s=0.5, cap_s=2.0, max_wait_s=10.0)
    rng = random.Random(0)
    waits = [policy.backoff(k, rng) for k in range(8) for _ in range(50)]
    assert all(0 <= w <= 2.0 for w in waits) and len(set(waits)) > 100  # jittered, capped
    assert next_wait(policy, 0, 0.0, 5.0, rng) >= 5.0  # Retry-After is a floor
    assert next_wait(policy, 3, 0.0, None, rng) is None  # attempts exhausted
    assert next_wait(policy, 0, 0.0, 11.0, rng) is None  # beyond the waiting budget: give up at once
    assert next_wait(policy, 1, 9.9, 0.5, rng) is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s({"retry-after": "3"}) == 3.0
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= retry_after_s({"retry-after": date}, now=now) <= 31
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None


def _client(handler, policy: RetryPolicy, key: str | None = None) -> tuple[ServerClient, list[float]]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    client = ServerClient(Endpoint.parse("http://test"), key, timeout_s=5, policy=policy, max_connections=4,
                          rng=random.Random(1), sleep=sleep, transport=httpx.MockTransport(handler))
    return client, slept


OK = chat_body([{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "b", "logprob": -3.0}]}])


def test_client_retries_429_5xx_and_resets_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        n = len(calls)
        if n == 1:
            return httpx.Response(429, headers={"retry-after": "7"}, json={"error": {"message": "slow down"}})
        if n == 2:
            raise httpx.ReadError("connection reset by peer")
        if n == 3:
            return httpx.Response(503, text="busy")
        if n == 4:
            raise httpx.ReadTimeout("timed out")
        return httpx.Response(200, json=OK)

    client, slept = _client(handler, RetryPolicy(attempts=6, max_wait_s=60))
    answer = asyncio.run(client.complete("chat", {"model": "m"}))
    assert answer.text == "hi" and len(calls) == 5 and slept[0] >= 7.0
    assert client.stats.retried == 1
    assert client.stats.failures == {"http 429": 1, "connection": 1, "http 503": 1, "timeout": 1}


def test_client_gives_up_after_bounded_attempts_and_never_retries_a_400() -> None:
    client, slept = _client(lambda r: httpx.Response(502, text="bad gateway"), RetryPolicy(attempts=3))
    with pytest.raises(RequestFailed, match="HTTP 502.*after 3 attempts") as info:
        asyncio.run(client.complete("chat", {}))
    assert info.value.retryable and len(slept) == 2
    calls = []

    def bad_request(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(400, json={"error": {"message": "max_tokens too large"}})

    client, _ = _client(bad_request, RetryPolicy(attempts=5))
    with pytest.raises(RequestFailed, match="max_tokens too large"):
        asyncio.run(client.complete("chat", {}))
    assert len(calls) == 1


def test_client_sends_the_key_only_in_the_header_and_scrubs_it_from_server_messages() -> None:
    key = "sk-test-SECRET-4b1d"
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"error": {"message": f"Incorrect API key provided: {key}"}})

    client, _ = _client(handler, RetryPolicy(attempts=1), key=key)
    with pytest.raises(RequestFailed) as info:
        asyncio.run(client.complete("chat", {}))
    assert seen == [f"Bearer {key}"] and key not in str(info.value) and "***" in str(info.value)


def test_endpoints_and_redaction() -> None:
    assert Endpoint.parse("http://h:8000/v1/").api("/models") == "http://h:8000/v1/models"
    assert Endpoint.parse("https://api.x.com/openai/v1").root("/version") == "https://api.x.com/openai/version"
    assert Endpoint.parse("https://u:pw@h/v1").public == "https://h"
    assert redact("http://user:secret@127.0.0.1:9/x") == "http://127.0.0.1:9/x"
    for bad in ("ftp://h", "h:8000", "http://h/v1?key=abc"):
        with pytest.raises(UserError):
            Endpoint.parse(bad)


def test_levels_reference_first_shuffle_seeded_fillers_seeded() -> None:
    assert parse_concurrency("32, 8,1,8") == [1, 8, 32]
    for bad in ("8,32", "1,x", "0,1"):
        with pytest.raises(UserError):
            parse_concurrency(bad)
    levels = make_levels([1, 8], fillers=4, prefix=True)
    assert [lv.name for lv in levels] == ["c1", "c8+f4", "prefix"] and levels[0].fillers == 0
    assert levels[0].order(10, 0) == list(range(10))
    shuffled = levels[1].order(10, 0)
    assert sorted(shuffled) == list(range(10)) and shuffled != list(range(10))
    assert shuffled == levels[1].order(10, 0) and shuffled != levels[1].order(10, 1)
    lengths = {len(filler(k, "c8+f4", 0).prompt.split()) for k in range(30)}
    assert filler(3, "c8", 0) == filler(3, "c8", 0) and len(lengths) > 10  # mixed lengths, reproducible


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([-0.5, -1.0, -1.0, -2.25, -9999.0])), min_size=1,
                max_size=6), st.integers(0, 5), st.sampled_from([-0.5, -1.0, -2.25]))
def test_top2_is_the_best_two_distinct_tokens_with_the_chosen_one_winning_ties(alternatives, chosen, chosen_lp) -> None:
    from flakecheck.probe.parse import Step, TokenRef

    step = Step(TokenRef(chosen, f"token_id:{chosen}"),
                chosen_lp, tuple((TokenRef(i, f"token_id:{i}"), lp) for i, lp in alternatives))
    (first, lp1), second = step.top2()
    best: dict[int, float] = {chosen: chosen_lp}
    for i, lp in alternatives:
        best[i] = max(best.get(i, lp), lp)
    assert lp1 == max(best.values())
    if best[chosen] == lp1:
        assert first.id == chosen
    if len(best) == 1:
        assert second is None
    else:
        assert second is not None and second[0].id != first.id
        assert second[1] == max(lp for i, lp in best.items() if i != first.id)
