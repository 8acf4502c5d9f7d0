"""A fake OpenAI-style server that breaks exactly one invariance axis on purpose, for the conformance check's
tests. Its "model" is tests.probe_fakes' hash model (here four steps in ten a near-tie); where the chosen
axis is exercised, its near-tie steps flip to their runner-up (or, with `logprobs_only`, every logprob moves
a little and no token changes):

- run_to_run: every second time the server sees the same request;
- co_resident: at least `flip_at` requests in flight when its batch is gathered (each request waits before
  its first step until `flip_at` are in flight or none has arrived for `window_s`, as a server gathers a
  batch: a burst's requests then all count);
- arrival: a request that arrived while `flip_at` or more others were already in flight;
- prefix_cache: a request whose first words were sent before with the same cache_salt (or both without one);
- chunked_prefill: a prompt of more than `chunk` words that arrives while another request is in flight;
- request_shape: a request with a stop sequence.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.probe_fakes import EOS, VOCAB, Behaviour, _response, _unit

AXES = ("run_to_run", "co_resident", "arrival", "prefix_cache", "chunked_prefill", "request_shape")


def next_step(prompt: str, history: list[int], flipped: bool) -> tuple[int, float, int, float]:
    """(chosen id, its logprob, runner-up id, its logprob): tests.probe_fakes' hash model with a near-tie at
    four steps in ten (so two short answers surely have one); `flipped` takes the runner-up at a near-tie."""
    top1 = int(_unit(prompt, history, "top") * (len(VOCAB) - 1))
    top2 = (top1 + 1 + int(_unit(prompt, history, "alt") * (len(VOCAB) - 2))) % (len(VOCAB) - 1)
    lp1 = -0.05 - 2.0 * _unit(prompt, history, "lp")
    near_tie = _unit(prompt, history, "tie") < 0.4
    gap = 0.001 if near_tie else 0.3 + 2.0 * _unit(prompt, history, "gap")
    if len(history) > 2 and _unit(prompt, history, "eos") < 0.02:
        return EOS, lp1, top2, lp1 - gap
    if near_tie and flipped:
        return top2, lp1 + 0.0002, top1, lp1 - 0.0002
    return top1, lp1, top2, lp1 - gap


@dataclass
class Breaks:
    axis: str | None = None  # None: a server that keeps every invariance
    flip_at: int = 16
    chunk: int = 40  # words
    logprobs_only: bool = False
    fail_salt: str | None = None  # answer HTTP 500 to every request whose cache_salt contains this
    seen: Counter = field(default_factory=Counter)
    salts: list = field(default_factory=list)  # every request's cache_salt, in arrival order
    cached: set = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0
    last_arrival: float = 0.0  # the event loop's time when the latest request arrived
    max_num_seqs: int | None = None  # reported in the model card (as flakecheck serve does), when given


def make_breaking_app(breaks: Breaks, step_delay_s: float = 0.003, window_s: float = 0.12) -> FastAPI:
    app = FastAPI()
    model = Behaviour()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card: dict[str, Any] = {"id": model.model, "object": "model", "root": "fake"}
        if breaks.max_num_seqs is not None:
            card["flakecheck"] = {"max_num_seqs": breaks.max_num_seqs}
        return {"object": "list", "data": [card]}

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": "0.0-fake"}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"prompt": "".join(VOCAB[t].decode("utf-8", errors="replace") for t in body["tokens"])}

    async def complete(request: Request, api: str) -> Any:
        body = await request.json()
        if breaks.fail_salt and breaks.fail_salt in (body.get("cache_salt") or ""):
            return JSONResponse({"error": {"message": "internal error"}}, status_code=500)
        prompt = repr(body["messages"]) if api == "chat" else body["prompt"]
        words = prompt.split()
        breaks.salts.append(body.get("cache_salt"))
        key = repr((prompt, body.get("max_tokens"), body.get("stop")))
        breaks.seen[key] += 1
        others = breaks.in_flight
        prefix_key = (body.get("cache_salt"), " ".join(words[:8]))
        hit = prefix_key in breaks.cached
        breaks.cached.add(prefix_key)
        breaks.in_flight += 1
        breaks.last_arrival = asyncio.get_running_loop().time()
        breaks.max_in_flight = max(breaks.max_in_flight, breaks.in_flight)
        axis = breaks.axis
        fixed = (axis == "run_to_run" and breaks.seen[key] % 2 == 0
                 or axis == "arrival" and others >= breaks.flip_at
                 or axis == "prefix_cache" and hit
                 or axis == "chunked_prefill" and len(words) > breaks.chunk and others >= 1
                 or axis == "request_shape" and "stop" in body)
        try:
            if axis == "co_resident":
                # gather a batch as a server does, until `flip_at` are in or no request has arrived for
                # window_s: on a loaded machine a burst's requests arrive further apart than a fixed window
                loop = asyncio.get_running_loop()
                while breaks.in_flight < breaks.flip_at and loop.time() - breaks.last_arrival < window_s:
                    await asyncio.sleep(0.005)
                fixed = breaks.in_flight >= breaks.flip_at
            steps: list[tuple[int, float, int, float]] = []
            history: list[int] = []
            while len(steps) < int(body.get("max_tokens", 16)) and (not history or history[-1] != EOS):
                await asyncio.sleep(step_delay_s)
                step = next_step(prompt, history, fixed and not breaks.logprobs_only)
                if fixed and breaks.logprobs_only:
                    step = (step[0], step[1] - 1e-3, step[2], step[3] - 2e-3)
                steps.append(step)
                history.append(step[0])
        finally:
            breaks.in_flight -= 1
        return _response(body, api, steps, model)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, "completions")

    return app
