"""The server under trouble: clients that go away, an engine step that fails, cache salts, context caps."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from flakecheck.engine import LoadedModel
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import Served, start_server

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea, the wind and the morning light."}]
LONG = 200


@pytest.fixture()
def server(serve_model: LoadedModel) -> Iterator[Served]:
    with start_server(serve_model, kernels="invariant") as served:
        yield served


def _stats(served: Served) -> dict[str, Any]:
    return httpx.get(f"{served.url}/stats").json()


def _wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
    """Poll until `condition` holds (a bound for a stuck server, not a timing assumption)."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _raw_post(served: Served, path: str, body: dict[str, Any]) -> socket.socket:
    url = urlparse(served.url)
    sock = socket.create_connection((url.hostname, url.port))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_is_aborted(server: Served, stream: bool) -> None:
    body = {"messages": MESSAGES, "max_tokens": LONG, "ignore_eos": True, "stream": stream}
    with server.state.loop.hold():
        sock = _raw_post(server, "/v1/chat/completions", body)
        _wait_for(lambda: _stats(server)["active_requests"] == 1, "the request to arrive")
        if stream:
            assert b"200 OK" in sock.recv(4096)  # the stream has started (role chunk)
        sock.close()
        if not stream:  # a plain request notices the disconnect at once, even while the engine waits
            _wait_for(lambda: _stats(server)["aborted_requests"] == 1, "the abort")
    _wait_for(lambda: _stats(server)["aborted_requests"] == 1, "the abort")
    stats = _stats(server)
    assert stats["active_requests"] == 0 and stats["finished_requests"] == 0
    assert stats["generated_tokens"] < LONG, "an abandoned request must not run to its end"
    # The server still answers.
    answer = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3},
                        timeout=60)
    assert answer.status_code == 200


def test_an_engine_failure_fails_the_batch_and_the_server_goes_on(server: Served,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    engine = server.state.loop.engine
    real_step, calls = engine.step, []

    def failing_step():  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated kernel crash")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 5}, timeout=60)
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "internal_server_error"
    assert "simulated kernel crash" in r.json()["error"]["message"]
    again = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 5,
                                                                  "ignore_eos": True}, timeout=60)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 5
    stats = _stats(server)
    assert (stats["failed_requests"], stats["finished_requests"], stats["active_requests"]) == (1, 1, 0)


def test_an_engine_that_cannot_recover_is_reported_unhealthy(server: Served,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    engine = server.state.loop.engine
    assert httpx.get(f"{server.url}/health").status_code == 200

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine, "step", broken)
    monkeypatch.setattr(engine, "abort", broken)
    body = {"messages": MESSAGES, "max_tokens": 5}
    first = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert first.status_code == 500 and "device lost" in first.json()["error"]["message"]
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and "device lost" in health.json()["error"]["message"]
    later = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert later.status_code == 500 and "unusable" in later.json()["error"]["message"]


def test_an_engine_failure_mid_stream_is_an_error_event(server: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = server.state.loop.engine
    real_step, calls = engine.step, []

    def failing_step():  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated kernel crash")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    body = {"messages": MESSAGES, "max_tokens": 10, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "simulated kernel crash" in json.loads(events[-2])["error"]["message"]


def test_cache_salt_isolates_prefix_cache_hits(serve_model: LoadedModel) -> None:
    long_question = "The capital of France is Paris. The capital of Italy is Rome. " * 3
    body = {"messages": [{"role": "user", "content": long_question}], "max_tokens": 4, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    with start_server(serve_model, kernels="invariant", enable_prefix_caching=True) as served, \
            httpx.Client(base_url=served.url, timeout=60) as client:
        def ask(salt: str | None) -> tuple[int, Any]:
            answer = client.post("/v1/chat/completions", json={**body, "cache_salt": salt}).json()
            return answer["usage"]["prompt_tokens_details"]["cached_tokens"], answer["choices"][0]["logprobs"]

        first = ask("alice")
        hits = [ask("alice"), ask("bob"), ask(None), ask(None)]
    assert first[0] == 0
    assert [h[0] > 0 for h in hits] == [True, False, False, True]
    assert all(h[1] == first[1] for h in hits), "fixed-order kernels: a prefix-cache hit changes nothing"


def test_max_model_len_caps_the_context_and_sets_the_default_max_tokens(serve_model: LoadedModel) -> None:
    with start_server(serve_model, kernels="invariant", max_model_len=48) as served:
        models = httpx.get(f"{served.url}/v1/models").json()
        answer = httpx.post(f"{served.url}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True},
                            timeout=60).json()
        refused = httpx.post(f"{served.url}/v1/completions", json={"prompt": [5] * 40, "max_tokens": 9})
        no_room = httpx.post(f"{served.url}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Hi " * 60}]})
    assert no_room.status_code == 400 and "1 for the completion" in no_room.json()["error"]["message"]
    assert models["data"][0]["max_model_len"] == 48
    assert answer["usage"]["total_tokens"] == 48 and answer["choices"][0]["finish_reason"] == "length"
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
