"""The access log of `flakecheck serve`: one line per HTTP request, written when its response has been sent
(a stream: when its last chunk has), e.g.

    2026-12-02T06:10:00.123Z POST /v1/chat/completions 200 1.234s id=chatcmpl-3f.. prompt_tokens=28 completion_tokens=24

method, path (never the query string), status, latency, and for a generation its response id and token
counts (`-` otherwise). Never a request or response body, a header or a key: a refused request shows here
with its status, and its reason stays in the response the client got. A pure ASGI middleware, so streamed
responses are timed to their end; a generation handler leaves its Generation in `request.state.generation`.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

GENERATION = "generation"  # the request.state attribute a generation handler sets


class AccessLog:
    def __init__(self, app: ASGIApp, stream: TextIO) -> None:
        self.app, self.stream = app, stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None
        logged = False

        async def sending(message: Message) -> None:
            nonlocal status, logged
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and not logged:
                logged = True
                self._write(scope, status, time.perf_counter() - started)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not logged:  # the handler raised, or the client went away mid-stream
                self._write(scope, status if status is not None else 500, time.perf_counter() - started)

    def _write(self, scope: Scope, status: int | None, seconds: float) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        line = f"{stamp} {scope.get('method', '-')} {scope.get('path', '-')} {status or '-'} {seconds:.3f}s"
        line += " " + _generation_fields(scope.get("state", {}).get(GENERATION))
        try:
            print(line, file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed or broken log stream must never fail a request
            pass


def _generation_fields(generation: Any) -> str:
    if generation is None:
        return "id=- prompt_tokens=- completion_tokens=-"
    usage = generation.usage()
    return f"id={generation.id} prompt_tokens={usage['prompt_tokens']} completion_tokens={usage['completion_tokens']}"
