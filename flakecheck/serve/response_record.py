"""`flakecheck serve --record-responses FILE`: one JSON line per generated choice, written when its response
has been sent, with what a client's own log may drop (promptfoo's results file keeps no logprobs):

    {"id": "chatcmpl-3f..", "choice": 0, "api": "chat", "time": "2026-12-07T03:08:28.310Z",
     "prompt_sha256": "…", "text": "Paris.",
     "finish_reason": "stop", "tokens": [{"id": 42, "token": "Paris", "bytes": [80, …], "logprob": -0.01,
                                          "top2": {"id": 7, "token": "London", "bytes": […], "logprob": -4.6}}, …]}

Every token with its top-2 alternative, whether or not the client asked for logprobs; `time` is when the
response was sent (UTC). The prompt itself is not
written, only `prompt_sha256` (prompt_sha256()), which a client's log that holds the prompt can recompute to
join its results to these lines (flakecheck.harness.promptfoo_results). Opt-in: the answers' text is written.
"""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import datetime, timezone
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flakecheck.serve.access_log import GENERATION

Messages = list[dict[str, str]]


def prompt_sha256(prompt: str | Messages) -> str:
    """The key of a request's prompt: a raw prompt's text, or the chat messages as [{role, content}] JSON."""
    if isinstance(prompt, str):
        text = prompt
    else:
        text = json.dumps([{"role": m["role"], "content": m["content"]} for m in prompt], ensure_ascii=False,
                          separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _prompts_of(body: Any) -> list[str | Messages | None]:
    messages = getattr(body, "messages", None)
    if messages is not None:
        return [[{"role": str(m["role"]), "content": str(m["content"] or "")}
                 for m in (message.as_template_input() for message in messages)]]
    prompt = getattr(body, "prompt", None)
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [None]  # token ids: no text to key on


def record_lines(generation: Any) -> list[dict[str, Any]]:
    """The record of a finished generation's choices (one dict each)."""
    texts = generation.state.texts
    prompts = _prompts_of(generation.body)
    api = "chat" if getattr(generation.body, "messages", None) is not None else "completions"
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    lines = []
    for index in sorted(generation.results):
        update = generation.results[index]
        if update.finish_reason is None:
            continue  # aborted: nothing was sent whole
        prompt = prompts[index] if index < len(prompts) else None
        tokens = [{"id": t, "token": texts.text(t), "bytes": texts.bytes(t), "logprob": lp1,
                   "top2": {"id": t2, "token": texts.text(t2), "bytes": texts.bytes(t2), "logprob": lp2}}
                  for t, lp1, t2, lp2 in zip(update.token_ids, update.top1_logprobs, update.top2_ids,
                                             update.top2_logprobs)]
        lines.append({"id": generation.id, "choice": index, "api": api, "time": stamp,
                      "prompt_sha256": prompt_sha256(prompt) if prompt is not None else None,
                      "text": update.text if update.text is not None else "".join(tk["token"] for tk in tokens),
                      "finish_reason": update.finish_reason, "tokens": tokens})
    return lines


class ResponseRecord:
    """ASGI middleware: after a generation's response is sent whole, its record lines go to `stream`."""

    def __init__(self, app: ASGIApp, stream: TextIO) -> None:
        self.app, self.stream = app, stream
        self.lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and status == 200:
                self._write(scope.get("state", {}).get(GENERATION))

        await self.app(scope, receive, sending)

    def _write(self, generation: Any) -> None:
        if generation is None:
            return
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in record_lines(generation))
        try:
            with self.lock:
                self.stream.write(text)
                self.stream.flush()
        except (OSError, ValueError):  # a broken record file must never fail a request
            pass
