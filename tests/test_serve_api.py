"""The OpenAI-compatible API of `flakecheck serve`: shapes, logprobs, stop strings, usage, streaming.

Uses the fixed-order (invariant) server wherever two answers are compared, so equal means equal.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from flakecheck.serve.schemas import MAX_TOP_LOGPROBS
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import SERVED_NAME, Served

QUESTION = "Write a haiku about the sea, the wind and the morning light over the water."
MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def client(invariant_server: Served) -> httpx.Client:
    with httpx.Client(base_url=invariant_server.url, timeout=120) as c:
        yield c


def _chat(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 12, **fields}
    return client.post("/v1/chat/completions", json=body).raise_for_status().json()


def _stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    events = []
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_models_lists_the_served_model(client: httpx.Client, invariant_server: Served) -> None:
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [SERVED_NAME]
    card = listing["data"][0]
    assert card["object"] == "model" and card["max_model_len"] == invariant_server.state.loaded.config.max_context
    assert card["flakecheck"]["max_num_seqs"] == invariant_server.state.settings.max_num_seqs  # the scheduler's limit
    assert client.get(f"/v1/models/{SERVED_NAME}").json()["id"] == SERVED_NAME
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_unknown_model_is_a_404_like_openai(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": MESSAGES})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model `gpt-4` does not exist.", "type": "invalid_request_error",
                                  "param": "model", "code": "model_not_found"}}


def test_chat_answer_shape_usage_and_logprobs(client: httpx.Client, invariant_server: Served) -> None:
    answer = _chat(client, logprobs=True, top_logprobs=2, ignore_eos=True)
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["model"] == SERVED_NAME
    assert answer["system_fingerprint"] == client.get("/version").json()["system_fingerprint"]
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    content = choice["logprobs"]["content"]
    tokenizer = invariant_server.state.loaded.tokenizer
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    prompt_ids = prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids
    usage = answer["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert usage["completion_tokens"] == len(content) == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 2
        assert (top[0]["token"], top[0]["logprob"], top[0]["bytes"]) == (entry["token"], entry["logprob"],
                                                                         entry["bytes"])  # greedy: top-1 chosen
        assert top[0]["logprob"] >= top[1]["logprob"]
        assert all(t["logprob"] <= 0 for t in top)
    # The bytes are the tokens' exact bytes: together they are the answer's text.
    special = set(tokenizer.all_special_tokens)
    raw = b"".join(bytes(e["bytes"]) for e in content if e["token"] not in special)
    assert raw.decode("utf-8", errors="replace") == choice["message"]["content"]


def test_top_logprobs_counts_and_token_ids(client: httpx.Client, invariant_server: Served) -> None:
    plain = _chat(client, logprobs=True, top_logprobs=2)
    as_ids = _chat(client, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    one = _chat(client, logprobs=True, top_logprobs=1)
    none = _chat(client, logprobs=True)
    without = _chat(client)
    assert without["choices"][0]["logprobs"] is None
    text = plain["choices"][0]["message"]["content"]
    assert {a["choices"][0]["message"]["content"] for a in (as_ids, one, none, without)} == {text}
    ids = [int(e["token"].removeprefix("token_id:")) for e in as_ids["choices"][0]["logprobs"]["content"]]
    assert invariant_server.state.loaded.tokenizer.decode(ids, skip_special_tokens=True) == text
    for a, b, c, d in zip(plain["choices"][0]["logprobs"]["content"], as_ids["choices"][0]["logprobs"]["content"],
                          one["choices"][0]["logprobs"]["content"], none["choices"][0]["logprobs"]["content"]):
        assert a["logprob"] == b["logprob"] == c["logprob"] == d["logprob"]
        assert [t["token"] for t in b["top_logprobs"]][0] == b["token"]
        assert c["top_logprobs"] == a["top_logprobs"][:1] and d["top_logprobs"] == []


def test_completions_legacy_logprobs(client: httpx.Client, invariant_server: Served) -> None:
    prompt = "The capital of France is"
    body = {"prompt": prompt, "max_tokens": 10, "logprobs": 2, "ignore_eos": True}
    answer = client.post("/v1/completions", json=body).raise_for_status().json()
    assert answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    [choice] = answer["choices"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 10
    assert lp["text_offset"][0] == 0
    assert [b - a for a, b in zip(lp["text_offset"], lp["text_offset"][1:])] == [len(t) for t in lp["tokens"][:-1]]
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[token] == logprob == max(top.values()) and 1 <= len(top) <= 2
    assert answer["usage"]["completion_tokens"] == 10
    # The same prompt as token ids gives the same answer; a list of prompts gives one choice each.
    prompt_ids = invariant_server.state.loaded.tokenizer(prompt)["input_ids"]
    by_ids = client.post("/v1/completions", json={**body, "prompt": prompt_ids}).json()
    assert by_ids["choices"][0]["text"] == choice["text"] and by_ids["usage"] == answer["usage"]
    two = client.post("/v1/completions", json={**body, "prompt": [prompt, "2 + 2?"]}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["text"] == choice["text"]
    assert two["usage"]["completion_tokens"] == 20
    assert two["usage"]["prompt_tokens"] == len(prompt_ids) + len(invariant_server.state.loaded.tokenizer("2 + 2?")
                                                                   ["input_ids"])


def test_completions_default_max_tokens_is_openais_16(client: httpx.Client) -> None:
    answer = client.post("/v1/completions", json={"prompt": "Hello", "ignore_eos": True}).json()
    assert answer["usage"]["completion_tokens"] == 16 and answer["choices"][0]["logprobs"] is None


def _stop_inside(text: str) -> tuple[str, int]:
    """A two-character stop string whose first occurrence starts after the first character."""
    for start in range(1, len(text) - 1):
        stop = text[start : start + 2]
        if text.find(stop) == start and "\ufffd" not in stop:
            return stop, start
    pytest.skip(f"no usable stop string in {text!r}")


def test_stop_string_trims_the_text_and_stops_the_sequence(client: httpx.Client, invariant_server: Served) -> None:
    full = _chat(client, max_tokens=24, ignore_eos=True, logprobs=True, return_tokens_as_token_ids=True)
    text = full["choices"][0]["message"]["content"]
    stop, at = _stop_inside(text)
    generated_before = client.get("/stats").json()["generated_tokens"]
    cut = _chat(client, max_tokens=24, ignore_eos=True, logprobs=True, return_tokens_as_token_ids=True,
                stop=[stop, "never appears \u2603"])
    generated = client.get("/stats").json()["generated_tokens"] - generated_before
    choice = cut["choices"][0]
    assert choice["message"]["content"] == text[:at]
    assert choice["finish_reason"] == "stop"
    tokens = [e["token"] for e in choice["logprobs"]["content"]]
    assert tokens == [e["token"] for e in full["choices"][0]["logprobs"]["content"]][: len(tokens)]
    assert cut["usage"]["completion_tokens"] == len(tokens) == generated < 24, "the engine stopped at the stop string"
    # The last token is the one that completed the stop string.
    ids = [int(t.removeprefix("token_id:")) for t in tokens]
    decode = invariant_server.state.loaded.tokenizer.decode
    assert stop in decode(ids, skip_special_tokens=True) and stop not in decode(ids[:-1], skip_special_tokens=True)


def test_streaming_gives_the_same_answer(client: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 12, "logprobs": True, "top_logprobs": 2, "ignore_eos": True}
    whole = client.post("/v1/chat/completions", json=body).json()
    events = _stream(client, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    content_chunks = [c["choices"][0] for c in chunks[:-1]]
    assert "".join(c["delta"].get("content", "") for c in content_chunks) == whole["choices"][0]["message"]["content"]
    streamed = [e for c in content_chunks if c["logprobs"] for e in c["logprobs"]["content"]]
    assert streamed == whole["choices"][0]["logprobs"]["content"]
    assert [c["finish_reason"] for c in content_chunks if c["finish_reason"]] == ["length"]


def test_streaming_with_a_stop_string_never_sends_text_it_later_cuts(client: httpx.Client) -> None:
    text = _chat(client, max_tokens=24, ignore_eos=True)["choices"][0]["message"]["content"]
    stop, at = _stop_inside(text)
    body = {"messages": MESSAGES, "max_tokens": 24, "ignore_eos": True, "stop": stop}
    events = _stream(client, "/v1/chat/completions", body)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in events[:-1] if c["choices"])
    assert streamed == text[:at]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_streaming_completions(client: httpx.Client) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 8, "logprobs": 1, "ignore_eos": True}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    events = _stream(client, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    choices = [c["choices"][0] for c in events[:-1]]
    assert "".join(c["text"] for c in choices) == whole["text"]
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    offsets = [t for c in choices if c["logprobs"] for t in c["logprobs"]["text_offset"]]
    assert tokens == whole["logprobs"]["tokens"] and offsets == whole["logprobs"]["text_offset"]
    assert choices[-1]["finish_reason"] == "length"


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": MESSAGES, "temperature": 0.7}, "temperature"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS + 1}, "top_logprobs"),
    ({"messages": MESSAGES, "top_logprobs": 1}, "top_logprobs"),
    ({"messages": MESSAGES, "n": 2}, "n"),
    ({"messages": MESSAGES, "presence_penalty": 0.5}, "presence_penalty"),
    ({"messages": MESSAGES, "logit_bias": {"5": 10}}, "logit_bias"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": "5"}, "max_tokens"),
    ({"messages": MESSAGES, "stop": [""]}, "stop"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": MESSAGES, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": MESSAGES, "min_tokens": 5}, "min_tokens"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({}, "messages"),
    ({"messages": MESSAGES, "max_tokens": 100_000}, "messages"),
])
def test_bad_chat_requests_are_openai_400s(client: httpx.Client, body: dict[str, Any], param: str) -> None:
    submitted = client.get("/stats").json()["submitted_requests"]
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert client.get("/stats").json()["submitted_requests"] == submitted, "nothing reaches the engine"


def test_a_role_the_openai_api_does_not_define_is_refused_naming_the_field(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [*MESSAGES, {"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and "messages.1.role" in r.json()["error"]["message"], r.text
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "Be brief."}, *MESSAGES],
                                                  "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "hi", "logprobs": MAX_TOP_LOGPROBS + 1}, "logprobs"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({"prompt": [1, 10**9]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "hi", "max_tokens": 100_000}, "prompt"),
])
def test_bad_completion_requests_are_openai_400s(client: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_over_long_prompt_is_refused_not_truncated(client: httpx.Client, invariant_server: Served) -> None:
    context = invariant_server.state.max_context
    r = client.post("/v1/completions", json={"prompt": [5] * context, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert str(context) in r.json()["error"]["message"]
    fits = client.post("/v1/completions", json={"prompt": [5] * (context - 1), "max_tokens": 1, "ignore_eos": True})
    assert fits.status_code == 200 and fits.json()["usage"]["prompt_tokens"] == context - 1


def test_malformed_json_and_unknown_routes(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_settings_irrelevant_to_greedy_decoding_are_accepted(client: httpx.Client) -> None:
    plain = _chat(client)
    seeded = _chat(client, seed=1234, temperature=0, top_p=0.9, top_k=5, response_format={"type": "text"},
                   user="someone")
    assert seeded["choices"][0]["message"] == plain["choices"][0]["message"]


def test_fingerprint_follows_the_kernels(splitk_server: Served, invariant_server: Served) -> None:
    prints = {httpx.get(f"{s.url}/version").json()["system_fingerprint"] for s in (splitk_server, invariant_server)}
    assert len(prints) == 2 and all(p.startswith("fp_") for p in prints)


def test_tokenize_and_detokenize_like_vllm(client: httpx.Client) -> None:
    answer = _chat(client, logprobs=True, return_tokens_as_token_ids=True)
    counted = client.post("/tokenize", json={"model": SERVED_NAME, "messages": MESSAGES}).json()
    assert counted["count"] == len(counted["tokens"]) == answer["usage"]["prompt_tokens"]
    plain = _chat(client, logprobs=True)
    for with_id, with_text in zip(answer["choices"][0]["logprobs"]["content"],
                                  plain["choices"][0]["logprobs"]["content"]):
        token_id = int(with_id["token"].removeprefix("token_id:"))
        text = client.post("/detokenize", json={"model": SERVED_NAME, "tokens": [token_id]}).json()["prompt"]
        assert text == with_text["token"]
    prompt = client.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": prompt}).json()["prompt"] == "The capital of France is"
    assert client.post("/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert client.post("/tokenize", json={"prompt": "x", "messages": MESSAGES}).status_code == 400
