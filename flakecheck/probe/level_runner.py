"""One load level against the server: the cases in flight, the fillers beside them, traces out.

A request that still fails after its retries stops the level: no new case starts, the requests in
flight are cancelled, and LevelFailed names every case that failed and counts those never sent.
The level's traces are then not saved (a level is kept whole or not at all, so its cases all ran
under the same load); the levels finished before it are, and `--resume` continues from there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flakecheck.data.routing import generated_digests
from flakecheck.data.traces import Trace
from flakecheck.probe.bodies import BodyOptions, CasePrompt, completion_body
from flakecheck.probe.client import RequestFailed, ServerClient
from flakecheck.probe.levels import LoadLevel, filler
from flakecheck.probe.parse import FLOOR_LOGPROB, Answer, AnswerError
from flakecheck.probe.vocab import MISSING, Vocab

# A salt unique to this process: requests of an earlier probe can never share cached blocks with ours.
RUN_NONCE = uuid.uuid4().hex[:12]


class LevelFailed(Exception):
    def __init__(self, level: str, repeat: int, failures: list[tuple[str, RequestFailed]], not_sent: int) -> None:
        self.level, self.repeat, self.failures, self.not_sent = level, repeat, failures, not_sent
        listed = "; ".join(f"case '{case_id}': {exc}" for case_id, exc in failures)
        super().__init__(f"level {level} (repeat {repeat}): {len(failures)} request(s) failed — {listed}; "
                         f"{not_sent} case(s) of the level not sent")


@dataclass
class LevelResult:
    traces: list[Trace]
    answers: dict[str, dict[str, Any]]  # per case: the server's text and system_fingerprint
    seconds: float
    fillers_sent: int = 0
    fillers_failed: int = 0
    filler_errors: list[str] = field(default_factory=list)


def trace_from_answer(case_id: str, level: str, repeat: int, answer: Answer, vocab: Vocab) -> Trace:
    """The server's tokens and top-2 logprobs as a Trace (ids from the server or interned by `vocab`), and the
    experts it routed each generated token to where it returns them (no router scores: no margins)."""
    tokens, top1_ids, top1_lps, top2_ids, top2_lps = [], [], [], [], []
    for step in answer.steps:
        tokens.append(vocab.id_of(step.token))
        (first, first_lp), second = step.top2()
        top1_ids.append(vocab.id_of(first))
        top1_lps.append(first_lp)
        top2_ids.append(vocab.id_of(second[0]) if second else MISSING)
        top2_lps.append(second[1] if second else FLOOR_LOGPROB)
    digests = None if answer.routed_experts is None else generated_digests(answer.routed_experts, len(tokens))
    return Trace(case_id, level, repeat, tokens, top1_ids, top1_lps, top2_ids, top2_lps, answer.finish_reason,
                 routing_digests=digests)


async def run_level(client: ServerClient, options: BodyOptions, level: LoadLevel, repeat: int,
                    cases: list[CasePrompt], vocab: Vocab, on_case_done: Callable[[Trace], None]) -> LevelResult:
    started = time.perf_counter()
    queue = [cases[i] for i in level.order(len(cases), repeat)]
    queue.reverse()  # pop() from the end takes them in order
    done: dict[str, tuple[Trace, Answer]] = {}
    failures: list[tuple[str, RequestFailed]] = []
    cases_over = asyncio.Event()
    result = LevelResult([], {}, 0.0)

    async def send(case: CasePrompt) -> Answer:
        salt = f"flakecheck-{RUN_NONCE}-{level.name}-{repeat}-{case.case_id}"
        if level.warm_prefix:
            # The warm-up and the case share a salt: the case may reuse the warm-up's cached prompt.
            warm = completion_body(options, case.api, case.prompt, 1, salt=salt, share_cache=True, logprobs=False)
            await client.complete(case.api, warm, logprobs_required=False)
            body = completion_body(options, case.api, case.prompt, case.max_tokens, salt=salt, share_cache=True,
                                   stop=case.stop)
        else:
            body = completion_body(options, case.api, case.prompt, case.max_tokens, salt=salt, stop=case.stop)
        return await client.complete(case.api, body)

    async def case_worker() -> None:
        while queue and not failures:
            case = queue.pop()
            try:
                answer = await send(case)
                trace = trace_from_answer(case.case_id, level.name, repeat, answer, vocab)
            except RequestFailed as exc:
                failures.append((case.case_id, exc))
                return
            except AnswerError as exc:  # e.g. token ids for some tokens and only text for others
                failures.append((case.case_id, RequestFailed(f"unusable answer: {exc}", 1, False)))
                return
            done[case.case_id] = (trace, answer)
            on_case_done(trace)

    async def filler_worker(slot: int) -> None:
        api = cases[0].api
        k = slot
        while not cases_over.is_set():
            f = filler(k, level.name, repeat)
            prompt = f.prompt if api == "completions" else [{"role": "user", "content": f.prompt}]
            salt = f"flakecheck-{RUN_NONCE}-{level.name}-{repeat}-filler-{k}"
            body = completion_body(options, api, prompt, f.max_tokens, salt=salt, logprobs=False)
            result.fillers_sent += 1
            try:
                await client.complete(api, body, logprobs_required=False)
            except RequestFailed as exc:  # a filler only adds load; its failure loses no result
                result.fillers_failed += 1
                if len(result.filler_errors) < 5:
                    result.filler_errors.append(str(exc))
            k += level.fillers

    workers = [asyncio.ensure_future(case_worker()) for _ in range(min(level.concurrency, len(cases)))]
    fillers = [asyncio.ensure_future(filler_worker(s)) for s in range(level.fillers)]
    try:
        await _until_done_or_failed(workers, failures)
    finally:
        cases_over.set()
        for task in [*workers, *fillers]:
            task.cancel()
        outcomes = await asyncio.gather(*workers, *fillers, return_exceptions=True)
    for outcome in outcomes:  # a bug, not a server fault: surface it rather than lose it in a task
        if isinstance(outcome, Exception) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
    if failures:
        raise LevelFailed(level.name, repeat, failures, len(queue))
    for case in cases:
        trace, answer = done[case.case_id]
        result.traces.append(trace)
        result.answers[case.case_id] = {"text": answer.text, "system_fingerprint": answer.system_fingerprint}
    result.seconds = time.perf_counter() - started
    return result


async def _until_done_or_failed(workers: list[asyncio.Future], failures: list) -> None:
    """Wait for every case worker, but stop at once when one records a failure."""
    pending = set(workers)
    while pending:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if failures:
            return
