"""One engine, one thread stepping it: continuous batching for every HTTP request at once.

Handlers `submit` jobs from the event loop; the engine thread adds them to the engine between two
steps, so a request that arrives while others decode joins the running batch at the next step.
After each step the thread checks stop strings (and aborts a sequence whose text hit one, freeing
its slot before the next step, as a production server does) and hands each job its new tokens
through the job's `deliver` callback (thread-safe, set by the handler). Requests whose client went
away are aborted the same way.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from flakecheck.data.stops import find_stop
from flakecheck.engine import Completion, LLMEngine, Request, SamplingParams
from flakecheck.serve.batch_stats import BatchStats

log = logging.getLogger("flakecheck.serve")


@dataclass(frozen=True)
class Update:
    """New tokens of one job since its last update. `text` is the whole generated text so far (trimmed
    at a stop string), present when the job streams or has stop strings, and on the last update."""

    token_ids: list[int]
    top1_logprobs: list[float]
    top2_ids: list[int]
    top2_logprobs: list[float]
    text: str | None
    finish_reason: str | None = None  # set on the last update: "stop" | "length"
    cached_prompt_tokens: int = 0
    error: str | None = None  # the job failed; the last update
    error_status: int = 500  # 400 when the engine refused the request itself
    # a mixture of experts: per new token, the experts each sparse layer chose for the row that produced it
    routed_experts: list[tuple[tuple[int, ...], ...]] | None = None

    @classmethod
    def failure(cls, message: str, status: int = 500) -> Update:
        return cls([], [], [], [], None, error=message, error_status=status)

    @property
    def last(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass
class Job:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    deliver: Callable[[Update], None]  # called on the engine thread; must be thread-safe
    stop: tuple[str, ...] = ()
    stream: bool = False
    ignore_eos: bool = False
    cache_salt: str | None = None
    sent: int = field(default=0, init=False)  # tokens already delivered


class EngineLoop:
    def __init__(self, engine: LLMEngine, decode: Callable[[list[int]], str]) -> None:
        self.engine, self.decode = engine, decode
        self.stats = BatchStats()
        self._commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._jobs: dict[str, Job] = {}
        self._held = False
        self._broken: str | None = None
        self._thread = threading.Thread(target=self._run, name="flakecheck-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._commands.put(("close", None))
            self._thread.join()

    def submit(self, job: Job) -> None:
        self.stats.count("submitted")
        self._commands.put(("add", job))

    def abort(self, request_id: str) -> None:
        """The client went away: finish the request at the next step boundary, deliver nothing more."""
        self._commands.put(("abort", request_id))

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Pause stepping while the block runs; submitted jobs queue up and all start in the next step.
        Lets a test build an exact batch (n requests in one forward pass) without relying on timing."""
        self._commands.put(("hold", True))
        try:
            yield
        finally:
            self._commands.put(("hold", False))

    # --- the engine thread ------------------------------------------------------------------------

    @property
    def broken(self) -> str | None:
        """Why the engine can serve no more (a failure it could not recover from), or None."""
        if self._broken is not None:
            return self._broken
        return None if self._thread.is_alive() else "the engine loop is not running"

    def _run(self) -> None:
        while True:
            idle = self._held or not self.engine.has_unfinished() or self._broken is not None
            commands = [self._commands.get()] if idle else []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for name, arg in commands:
                if name == "close":
                    self._fail_all("the server is shutting down")
                    return
                self._apply(name, arg)
            try:
                if self._held or self._broken is not None or not self.engine.has_unfinished():
                    continue
                finished = self.engine.step()
                self.stats.record_step(self.engine.stats)
                self._after_step({c.request_id: c for c in finished})
            except Exception as exc:  # a bug or an exhausted machine: fail the batch, keep serving if we can
                log.exception("engine loop failed")
                self._fail_all(f"the engine failed: {exc.__class__.__name__}: {exc}")
                if self.engine.has_unfinished():  # it could not even abort: stop stepping for good
                    self._broken = f"{exc.__class__.__name__}: {exc}"

    def _apply(self, name: str, arg: object) -> None:
        if name == "hold":
            self._held = bool(arg)
        elif name == "add":
            job = arg
            assert isinstance(job, Job)
            if self._broken is not None:
                self._send(job, Update.failure(f"the engine is unusable: {self._broken}"), "failed")
                return
            request = Request(job.request_id, job.prompt_ids, SamplingParams(job.max_tokens, job.ignore_eos),
                              cache_salt=job.cache_salt)
            try:
                self.engine.add_request(request)
            except ValueError as exc:  # the handler checks lengths first; this is the engine's last word
                self._send(job, Update.failure(str(exc), 400), "failed")
                return
            except Exception as exc:
                log.exception("adding a request failed")
                self._send(job, Update.failure(f"{exc.__class__.__name__}: {exc}"), "failed")
                return
            self._jobs[job.request_id] = job
        elif name == "abort":
            job = self._jobs.pop(str(arg), None)
            if job is not None:
                self.stats.count("aborted")
                try:
                    self.engine.abort(job.request_id)
                except Exception:  # the next step's failure handling deals with a broken engine
                    log.exception("aborting a request failed")

    def _after_step(self, finished: dict[str, Completion]) -> None:
        for request_id, job in list(self._jobs.items()):
            completion = finished.get(request_id)
            if completion is None and (job.stream or job.stop):
                completion = self.engine.progress(request_id)
            if completion is not None:
                self._advance(job, completion, done=request_id in finished)

    def _advance(self, job: Job, completion: Completion, done: bool) -> None:
        tokens = completion.token_ids
        if len(tokens) == job.sent and not done:
            return  # still prefilling a chunked prompt
        text, reason = None, completion.finish_reason if done else None
        if job.stream or job.stop or done:
            text = self.decode(tokens)
            cut = find_stop(text, job.stop)
            if cut is not None:
                text, reason = text[:cut], "stop"
                if not done:
                    self.engine.abort(job.request_id, "stop")
        if reason is None and not job.stream:
            return
        new = slice(job.sent, len(tokens))
        job.sent = len(tokens)
        routed = None if completion.routing is None else [r.experts for r in completion.routing[new]]
        update = Update(tokens[new], completion.top1_logprobs[new], completion.top2_ids[new],
                        completion.top2_logprobs[new], text, reason, completion.cached_prompt_tokens,
                        routed_experts=routed)
        self._send(job, update, "finished" if reason else None)

    def _send(self, job: Job, update: Update, outcome: str | None) -> None:
        if outcome is not None:
            self._jobs.pop(job.request_id, None)
            self.stats.count(outcome)
        try:
            job.deliver(update)
        except RuntimeError:  # the handler's event loop is gone (server shutting down)
            pass

    def _fail_all(self, message: str) -> None:
        for job in list(self._jobs.values()):
            with contextlib.suppress(Exception):
                self.engine.abort(job.request_id)
            self._send(job, Update.failure(message), "failed")
