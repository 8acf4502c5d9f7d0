"""One HTTP request's prompts as engine-loop jobs, and the updates that come back.

Lengths are checked here, before anything reaches the engine: a prompt plus its max_tokens beyond
the context is refused (never truncated). Updates arrive from the engine thread through
`call_soon_threadsafe` into one asyncio queue per HTTP request; if the handler goes away (client
disconnect, cancelled stream), its unfinished jobs are aborted so they stop occupying the batch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from starlette.requests import Request

from flakecheck.serve.engine_loop import Job, Update
from flakecheck.serve.errors import APIError, ClientGone, bad_request
from flakecheck.serve.schemas import GenerationRequest
from flakecheck.serve.state import ServerState


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    max_tokens: int


def plan_prompt(state: ServerState, ids: list[int], requested: int | None, default: int | None,
                param: str) -> Prompt:
    """The prompt with its max_tokens (requested, else `default`, else the rest of the context)."""
    if not ids:
        raise bad_request("the prompt is empty (no tokens)", param)
    context = state.max_context
    max_tokens = requested if requested is not None else default if default is not None else \
        max(context - len(ids), 1)
    if len(ids) + max_tokens > context:
        raise bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt; {max_tokens} for the completion). "
            "Please reduce the length of the prompt or of the completion (prompts are never truncated).",
            param, "context_length_exceeded")
    return Prompt(ids, max_tokens)


class Generation:
    def __init__(self, state: ServerState, prefix: str, prompts: list[Prompt], body: GenerationRequest) -> None:
        self.state = state
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.prompts = prompts
        self.queue: asyncio.Queue[tuple[int, Update]] = asyncio.Queue()
        self.unfinished: set[int] = set(range(len(prompts)))
        self.results: dict[int, Update] = {}  # every choice's updates so far, merged
        self.stop_strings = body.stop_strings()
        self._body = body

    @property
    def body(self) -> GenerationRequest:
        return self._body

    def _job_id(self, index: int) -> str:
        return f"{self.id}-{index}"

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for index, prompt in enumerate(self.prompts):
            def deliver(update: Update, index: int = index) -> None:
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, update))

            self.state.loop.submit(Job(
                self._job_id(index), prompt.ids, prompt.max_tokens, deliver, self.stop_strings, self._body.stream,
                self._body.ignore_eos, self._body.cache_salt,
            ))

    async def updates(self, request: Request | None = None) -> AsyncIterator[tuple[int, Update]]:
        """(choice index, update) until every job finished. With `request`, a client that disconnects
        aborts the jobs (a streaming response is cancelled by Starlette instead: leave it None)."""
        gone = asyncio.ensure_future(_disconnected(request)) if request is not None else None
        try:
            while self.unfinished:
                index, update = await self._next(gone)
                if update.error is not None:
                    self.unfinished.discard(index)
                    raise APIError(update.error_status, update.error, code="engine_error")
                if update.last:
                    self.unfinished.discard(index)
                self.results[index] = merge(self.results[index], update) if index in self.results else update
                yield index, update
        finally:
            if gone is not None:
                gone.cancel()
            for index in self.unfinished:
                self.state.loop.abort(self._job_id(index))
            self.unfinished.clear()

    async def _next(self, gone: asyncio.Future[None] | None) -> tuple[int, Update]:
        if gone is None:
            return await self.queue.get()
        getter = asyncio.ensure_future(self.queue.get())
        await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            raise ClientGone()
        return getter.result()

    async def collect(self, request: Request) -> list[Update]:
        """Every choice's whole result, in index order."""
        async for _ in self.updates(request):
            pass
        return [self.results[i] for i in range(len(self.prompts))]

    def usage(self) -> dict[str, object]:
        prompt_tokens = sum(len(p.ids) for p in self.prompts)
        completion_tokens = sum(len(u.token_ids) for u in self.results.values())
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(u.cached_prompt_tokens for u in self.results.values())},
        }


def merge(a: Update, b: Update) -> Update:
    routed = None if a.routed_experts is None or b.routed_experts is None else a.routed_experts + b.routed_experts
    return replace(b, token_ids=a.token_ids + b.token_ids, top1_logprobs=a.top1_logprobs + b.top1_logprobs,
                   top2_ids=a.top2_ids + b.top2_ids, top2_logprobs=a.top2_logprobs + b.top2_logprobs,
                   text=b.text if b.text is not None else a.text, routed_experts=routed)


async def _disconnected(request: Request) -> None:
    """Returns when the client has closed the connection (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

