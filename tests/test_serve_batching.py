"""Continuous batching over HTTP: the same prompts sent one at a time, then all at once.

split-K kernels pick their split counts from the batch shape, so answering in a batch of >= 8 must
change some top-2 logprob (the server's /stats proves the batch held >= 8 sequences); fixed-order
kernels must give bitwise-identical token ids and logprobs either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import Served

QUESTIONS = [
    "What is the capital of France? Answer in one word, then explain why in a sentence or two.",
    "2 + 2?",
    "Write a haiku about the sea, the wind and the morning light over the water.",
    "def add(a, b):",
    "Name the city.",
    "Answer with a single letter: A, B, C or D. Which one is the second letter of the alphabet?",
    '{"name": "Ada", "age": 36}',
    "What is 7 * 6?",
    "The capital of Italy is Rome. What is the capital of France?",
    "Write a function that returns a + b.",
]
TOKENS = 16


def _body(question: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": question}], "max_tokens": TOKENS, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True, "temperature": 0}


def _trace(answer: dict[str, Any]) -> list[tuple]:
    """Per token: the chosen id and logprob, and the top-2 (id, logprob) pairs, exactly as sent."""
    return [(e["token"], e["logprob"], tuple((t["token"], t["logprob"]) for t in e["top_logprobs"]))
            for e in answer["choices"][0]["logprobs"]["content"]]


def _serial(url: str) -> list[list[tuple]]:
    with httpx.Client(base_url=url, timeout=120) as client:
        return [_trace(client.post("/v1/chat/completions", json=_body(q)).raise_for_status().json())
                for q in QUESTIONS]


def _concurrent(served: Served) -> list[list[tuple]]:
    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as client:
            # Held between steps until every request has arrived, so all of them start in one step:
            # the batch is exact, not a matter of timing.
            with served.state.loop.hold():
                sent = [asyncio.create_task(client.post("/v1/chat/completions", json=_body(q))) for q in QUESTIONS]
                while (await client.get("/stats")).json()["active_requests"] < len(QUESTIONS):
                    await asyncio.sleep(0.01)
            return list(await asyncio.gather(*sent))

    return [_trace(r.raise_for_status().json()) for r in asyncio.run(send_all())]


def _steps_by_batch(url: str) -> dict[int, int]:
    return {int(k): v for k, v in httpx.get(f"{url}/stats").json()["running_seqs_histogram"].items()}


def _batched_steps(before: dict[int, int], after: dict[int, int], at_least: int) -> int:
    return sum(n - before.get(k, 0) for k, n in after.items() if k >= at_least)


def test_splitk_server_answers_change_with_the_batch(splitk_server: Served) -> None:
    serial = _serial(splitk_server.url)
    before = _steps_by_batch(splitk_server.url)
    together = _concurrent(splitk_server)
    after = _steps_by_batch(splitk_server.url)
    assert _batched_steps(before, after, 8) >= TOKENS, "the concurrent requests should have shared the batch"
    assert all(len(t) == TOKENS for t in serial + together)
    changed = [i for i, (a, b) in enumerate(zip(serial, together)) if a != b]
    assert changed, "split-K kernels should give some other top-2 logprob in a batch of 10 than alone"


def test_invariant_server_is_bitwise_identical_in_any_batch(invariant_server: Served) -> None:
    serial = _serial(invariant_server.url)
    before = _steps_by_batch(invariant_server.url)
    together = _concurrent(invariant_server)
    after = _steps_by_batch(invariant_server.url)
    assert _batched_steps(before, after, 8) >= TOKENS
    assert all(len(t) == TOKENS for t in serial)
    assert together == serial
