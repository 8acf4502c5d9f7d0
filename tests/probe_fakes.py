"""Test doubles for the probe: a small OpenAI-style server (FastAPI + uvicorn on a free loopback port)
and a fault-injecting TCP proxy (asyncio + h11) that drops connections and answers 503.

The fake server's "model" is a hash: each step's top-1 and top-2 words and their logprobs follow
from the prompt and the words so far, and about one step in seven is a near-tie. With
`batch_variance`, a near-tie step flips to its runner-up while at least `flip_at` requests are in
flight: a server whose answers depend on the load, as a real one's do. It speaks every shape the
probe parses (vLLM-style "token_id:N", llama.cpp-style `id` fields, plain text; legacy or
`content[]` completions) and records what it was sent and how many requests it held at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from flakecheck.data.routing import encode_routed_experts

WORDS = [" river", " stone", " light", " paper", " city", " music", " table", " winter", " forest", " number",
         " letter", " story", " bridge", " market", " summer", " quiet", " planet", " engine", " signal", " orange",
         " café", " naïve", " 42", "\n", " the", " a", " of", " and"]
EURO = (b"\xe2\x82", b"\xac")  # "€" split across two tokens, as byte-level BPE does
EOS = len(WORDS) + 2
VOCAB = [w.encode() for w in WORDS] + list(EURO) + [b""]  # id -> bytes; the last is EOS


def _unit(*parts: Any) -> float:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Behaviour:
    model: str = "fake-model"
    # vllm: "token_id:N" when asked (bytes spell the placeholder); serve: the same with the token's real
    # bytes (flakecheck serve); llamacpp: `id` fields + content[] everywhere; text: no ids at all
    shape: str = "vllm"
    legacy_completions: bool = True  # /v1/completions in the legacy shape (llamacpp: always content[])
    logprobs: bool = True
    version: str | None = "0.0-fake"
    batch_variance: bool = True
    flip_at: int = 4
    step_delay_s: float = 0.003
    reject_fields: tuple[str, ...] = ()
    models_route: bool = True
    not_openai: bool = False
    fail_salt: str | None = None  # answer 500 to every request whose cache_salt contains this
    # a mixture of experts (2 layers, top-2 of 8) returning vLLM's `routed_experts`: one row per prompt
    # "token" (a word) and per generated token but the last; under load a near-tied router swaps an expert
    routed_experts: bool = False
    # a server with known flip probabilities: a prompt that says "chance=P" has one near-tie (its second step)
    # that flips to the runner-up in a share P of its requests while `flip_at` are in flight, whose gap
    # jitters under load (so the noise is measurable); every other step of every prompt has a wide gap
    chances: random.Random | None = None


@dataclass
class Record:
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: Counter = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    routed: dict[str, Any] = field(default_factory=dict)  # cache_salt -> the routed_experts text answered


def chance_of(prompt: str) -> float:
    found = re.search(r"chance=([0-9.]+)", prompt)
    return float(found.group(1)) if found else 0.0


def next_step(prompt: str, history: list[int], in_flight: int, b: Behaviour,
              roll: float = 1.0) -> tuple[int, float, int, float]:
    """(chosen id, its logprob, runner-up id, its logprob) for the step after `history`; `roll`: the request's
    uniform draw (the chance mode)."""
    u = _unit(prompt, history, "top")
    if b.chances is not None:
        top1 = int(u * (len(VOCAB) - 1))
        top2 = (top1 + 1) % (len(VOCAB) - 1)
        if len(history) != 1 or chance_of(prompt) <= 0:
            return top1, -0.05, top2, -2.0
        loaded = in_flight >= b.flip_at
        if loaded and roll < chance_of(prompt):
            return top2, -0.69, top1, -0.70
        jitter = 0.004 * (1 + int(roll * 4)) if loaded else 0.0  # up to 0.016: past the gap of 0.01
        return top1, -0.69 + jitter, top2, -0.70
    top1 = int(u * (len(VOCAB) - 1))
    top2 = (top1 + 1 + int(_unit(prompt, history, "alt") * (len(VOCAB) - 2))) % (len(VOCAB) - 1)
    lp1 = -0.05 - 2.0 * _unit(prompt, history, "lp")
    near_tie = _unit(prompt, history, "tie") < 0.15
    gap = 0.001 if near_tie else 0.3 + 2.0 * _unit(prompt, history, "gap")
    if len(history) > 2 and _unit(prompt, history, "eos") < 0.04:
        return EOS, lp1, top2, lp1 - gap
    if near_tie and b.batch_variance and in_flight >= b.flip_at:
        return top2, lp1 + 0.0002, top1, lp1 - 0.0002
    return top1, lp1, top2, lp1 - gap


def fake_experts(prompt: str, row: int, in_flight: int, b: Behaviour) -> list[list[int]]:
    """Row `row`'s top-2 of 8 experts in each of 2 layers; under load (`in_flight` >= flip_at) a near-tied
    router (one row in five) swaps the second expert of layer 1."""
    layers = [[int(_unit(prompt, row, layer, "e1") * 4), 4 + int(_unit(prompt, row, layer, "e2") * 4)]
              for layer in range(2)]
    if b.batch_variance and in_flight >= b.flip_at and _unit(prompt, row, "router-tie") < 0.2:
        layers[1][1] = 4 + (layers[1][1] - 3) % 4
    return layers


def _text(token_id: int) -> str:
    return VOCAB[token_id].decode("utf-8", errors="replace")


def _entry(token_id: int, logprob: float, shape: str, as_ids: bool) -> dict[str, Any]:
    if shape in ("vllm", "serve") and as_ids:
        token = f"token_id:{token_id}"
        return {"token": token, "logprob": logprob,
                "bytes": list(token.encode() if shape == "vllm" else VOCAB[token_id])}
    if shape == "mixed" and as_ids and token_id % 2:  # a broken server: ids for some tokens only
        token = f"token_id:{token_id}"
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    entry = {"token": _text(token_id), "logprob": logprob, "bytes": list(VOCAB[token_id])}
    if shape == "llamacpp":
        entry["id"] = token_id
    return entry


def make_app(b: Behaviour, record: Record) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models(request: Request):
        record.authorizations[request.headers.get("authorization")] += 1
        if b.not_openai:
            return PlainTextResponse("<html>hello</html>")
        if not b.models_route:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return {"object": "list", "data": [{"id": b.model, "object": "model"}]}

    @app.get("/version")
    async def version():
        if b.version is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return {"version": b.version}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        return {"prompt": "".join(_text(t) for t in body["tokens"])}

    async def complete(request: Request, api: str):
        record.authorizations[request.headers.get("authorization")] += 1
        body = await request.json()
        record.bodies.append(body)
        if b.fail_salt and b.fail_salt in body.get("cache_salt", ""):
            return JSONResponse({"error": {"message": "internal error"}}, status_code=500)
        rejected = [f for f in b.reject_fields if f in body]
        if rejected:
            return JSONResponse({"error": {"message": f"Unrecognized request argument supplied: {rejected[0]}",
                                           "type": "invalid_request_error"}}, status_code=400)
        if body.get("model") != b.model:
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist."}},
                                status_code=404)
        prompt = repr(body["messages"]) if api == "chat" else body["prompt"]
        record.in_flight += 1
        record.max_in_flight = max(record.max_in_flight, record.in_flight)
        try:
            steps: list[tuple[int, float, int, float]] = []
            history: list[int] = []
            loads: list[int] = []  # requests in flight at each step
            roll = b.chances.random() if b.chances is not None else 1.0
            while len(steps) < int(body.get("max_tokens", 16)) and (not history or history[-1] != EOS):
                await asyncio.sleep(b.step_delay_s)  # let other requests join, as in a batch
                loads.append(record.in_flight)
                steps.append(next_step(prompt, history, record.in_flight, b, roll))
                history.append(steps[-1][0])
        finally:
            record.in_flight -= 1
        response = _response(body, api, steps, b, loads)
        if "routed_experts" in response["choices"][0]:
            record.routed[body.get("cache_salt", "")] = response["choices"][0]["routed_experts"]
        return response

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "completions")

    return app


def _response(body: dict[str, Any], api: str, steps: list[tuple[int, float, int, float]], b: Behaviour,
              loads: list[int] | None = None) -> dict:
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    text = b"".join(VOCAB[t] for t, *_ in steps).decode("utf-8", errors="replace")
    finish = "stop" if steps and steps[-1][0] == EOS else "length"
    want = body.get("logprobs")
    logprobs: Any = None
    if b.logprobs and want:
        content = [{**_entry(t, lp, b.shape, as_ids),
                    "top_logprobs": [_entry(t, lp, b.shape, as_ids), _entry(o, lpo, b.shape, as_ids)]}
                   for t, lp, o, lpo in steps]
        if api == "completions" and b.legacy_completions and b.shape != "llamacpp":
            key = (lambda e: e["token"])
            logprobs = {"tokens": [key(c) for c in content], "token_logprobs": [c["logprob"] for c in content],
                        "top_logprobs": [{key(a): a["logprob"] for a in c["top_logprobs"]} for c in content],
                        "text_offset": list(range(len(content)))}
        else:
            logprobs = {"content": content}
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
    if b.routed_experts and steps:
        prompt = repr(body["messages"]) if api == "chat" else body["prompt"]
        last = max(1, len(prompt.split())) - 1  # the prompt's last row chooses the first token
        choice["routed_experts"] = encode_routed_experts(
            [fake_experts(prompt, row, 0, b) for row in range(last)]
            + [fake_experts(prompt, last + i, in_flight, b) for i, in_flight in enumerate(loads or [0] * len(steps))])
    if api == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": "cmpl-fake", "object": "chat.completion" if api == "chat" else "text_completion",
            "model": b.model, "system_fingerprint": "fp_fake", "choices": [choice],
            "usage": {"completion_tokens": len(steps)}}


class ThreadedServer:
    """uvicorn serving an ASGI app on a free loopback port, in a thread (start/stop from a test)."""

    def __init__(self, app: Any, tls: tuple[str, str] | None = None) -> None:
        """`tls`: (certificate file, key file) to serve HTTPS."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        certfile, keyfile = tls or (None, None)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                    ssl_certfile=certfile, ssl_keyfile=keyfile))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    """A TCP proxy that reads one HTTP request per connection and, seeded by the request itself and how
    often it was seen before, drops the connection (10%: half before forwarding it, half after the
    server answered) or answers 503 with Retry-After: 0 (10%); otherwise it forwards the request and
    returns the answer. A request is faulted at most `max_faults` times in a row, so bounded retries
    always get through; every decision is counted in `faults`."""

    def __init__(self, upstream: str, drop: float = 0.1, unavailable: float = 0.1, max_faults: int = 3) -> None:
        self.upstream, self.drop, self.unavailable, self.max_faults = upstream, drop, unavailable, max_faults
        self.seen: Counter = Counter()
        self.faults: Counter = Counter()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    async def _start(self) -> None:
        self.client = httpx.AsyncClient(base_url=self.upstream, timeout=120)
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()
        await self.client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            conn = h11.Connection(h11.SERVER)
            request, body = None, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
            assert request is not None
            key = hashlib.sha256(request.method + request.target + body).hexdigest()
            k = self.seen[key]
            self.seen[key] += 1
            r = random.Random(f"{key}:{k}").random() if k < self.max_faults else 1.0
            if r < self.drop / 2:
                self.faults["drop before"] += 1
                return
            if r < self.drop + self.unavailable and r >= self.drop:
                self.faults["503"] += 1
                await self._reply(conn, writer, 503, b'{"error": {"message": "overloaded"}}', {"retry-after": "0"})
                return
            headers = {k.decode(): v.decode() for k, v in request.headers
                       if k.lower() not in (b"host", b"connection", b"content-length")}
            upstream = await self.client.request(request.method.decode(), request.target.decode(), content=body,
                                                 headers=headers)
            if r < self.drop:
                self.faults["drop after"] += 1
                return
            self.faults["forwarded"] += 1
            await self._reply(conn, writer, upstream.status_code, upstream.content,
                              {"content-type": upstream.headers.get("content-type", "application/json")})
        finally:
            writer.close()

    async def _reply(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, content: bytes,
                     headers: dict[str, str]) -> None:
        head = [(k, v) for k, v in headers.items()] + [("content-length", str(len(content))), ("connection", "close")]
        writer.write(conn.send(h11.Response(status_code=status, headers=head)))
        writer.write(conn.send(h11.Data(data=content)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
