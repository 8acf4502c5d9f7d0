"""One unit of a conformance check against the server: its bursts in turn, each burst's requests in flight
together, the targets' answers as traces (ids from the server or interned by the shared vocabulary).

A target whose request still fails after its retries stops the unit (UnitFailed): a unit is kept whole or
not at all. A request the server refuses as unsupported (HTTP 400 or 422: `n` > 1, more logprobs than it
keeps) marks the unit unsupported instead: the API does not allow that variant there. A filler's failure
loses no result (it only adds load) and is counted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from flakecheck.data.traces import Trace
from flakecheck.probe.bodies import BodyOptions, completion_body
from flakecheck.probe.client import RequestFailed, ServerClient
from flakecheck.probe.conformance.plan import Request, Unit
from flakecheck.probe.level_runner import RUN_NONCE, trace_from_answer
from flakecheck.probe.parse import Answer, AnswerError
from flakecheck.probe.vocab import Vocab


class UnitFailed(Exception):
    def __init__(self, unit: str, label: str, cause: RequestFailed) -> None:
        self.unit, self.label, self.cause = unit, label, cause
        super().__init__(f"{unit}: the request of {label!r} failed: {cause}")


@dataclass
class UnitResult:
    traces: list[Trace]
    seconds: float
    fingerprints: list[str] = field(default_factory=list)
    unsupported: str | None = None  # the server's refusal of this variant
    fillers_sent: int = 0
    fillers_failed: int = 0
    texts: dict[str, str] = field(default_factory=dict)  # each target's answer text, as the server wrote it

    def extras(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "fingerprints": sorted(set(self.fingerprints)),
                "unsupported": self.unsupported, "fillers_sent": self.fillers_sent,
                "fillers_failed": self.fillers_failed, "texts": self.texts}


def request_body(options: BodyOptions, request: Request) -> dict[str, Any]:
    prompt = request.prompt
    salt = None if request.salt is None else f"{request.salt}-{RUN_NONCE}"
    body = completion_body(options, prompt.api, prompt.text, request.max_tokens or prompt.max_tokens,
                           salt=salt, share_cache=request.share_cache, logprobs=request.target,
                           stop=prompt.stop if request.stop is None else request.stop)
    if request.target and request.top_logprobs != 2:
        body["top_logprobs" if prompt.api == "chat" else "logprobs"] = request.top_logprobs
    body["n"] = request.n
    return body


async def run_unit(client: ServerClient, options: BodyOptions, unit: Unit, vocab: Vocab) -> UnitResult:
    started = time.perf_counter()
    result = UnitResult([], 0.0)
    answers: list[tuple[Request, Answer]] = []

    async def send(request: Request) -> None:
        if request.delay_s:
            await asyncio.sleep(request.delay_s)
        body = request_body(options, request)
        if not request.target:
            result.fillers_sent += 1
            try:
                await client.complete(request.prompt.api, body, logprobs_required=False)
            except RequestFailed:
                result.fillers_failed += 1
            return
        try:
            answers.append((request, await client.complete(request.prompt.api, body)))
        except RequestFailed as exc:
            if exc.status in (400, 422) and (request.n != 1 or request.top_logprobs != 2):
                result.unsupported = result.unsupported or str(exc)
                return
            raise UnitFailed(unit.name, request.label, exc) from None

    for burst in unit.bursts:
        await asyncio.gather(*(send(request) for request in burst))
    if result.unsupported:
        result.seconds = time.perf_counter() - started
        return result
    for request, answer in answers:
        try:
            result.traces.append(trace_from_answer(request.label, unit.name, 0, answer, vocab))
        except AnswerError as exc:
            raise UnitFailed(unit.name, request.label, RequestFailed(f"unusable answer: {exc}", 1, False)) from None
        result.texts[request.label] = answer.text
        if answer.system_fingerprint:
            result.fingerprints.append(answer.system_fingerprint)
    result.seconds = time.perf_counter() - started
    return result
