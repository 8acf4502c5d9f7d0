"""The HTTP side of a probe: httpx's AsyncClient, requests retried per flakecheck.probe.retries.

The API key travels only in the Authorization header. Every text that comes back from the server
(an error message may quote the request) passes through `scrub` before it can reach an exception,
the terminal or a file. TLS certificates are verified (httpx's default); nothing turns that off.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from flakecheck.probe.endpoint import Endpoint
from flakecheck.probe.parse import Answer, AnswerError, parse_answer
from flakecheck.probe.retries import RetryPolicy, next_wait, retry_after_s, retryable_status

T = TypeVar("T")
ROUTES = {"chat": "/chat/completions", "completions": "/completions"}


class RequestFailed(Exception):
    """A request that did not produce an answer: after its last attempt, or at once when retrying is pointless."""

    def __init__(self, what: str, attempts: int, retryable: bool, status: int | None = None) -> None:
        self.what, self.attempts, self.retryable, self.status = what, attempts, retryable, status
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"{what}{tries}")


@dataclass(frozen=True)
class Failure:
    """One failed attempt: what kind (for the counts), what happened, and whether another attempt may help."""

    kind: str
    what: str
    retryable: bool
    status: int | None = None
    retry_after: float | None = None


@dataclass
class ClientStats:
    requests: int = 0
    attempts: int = 0
    retried: int = 0  # requests that needed more than one attempt
    failures: dict[str, int] = field(default_factory=dict)  # what went wrong, per attempt, by kind

    def count(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1


class ServerClient:
    def __init__(self, endpoint: Endpoint, api_key: str | None, *, timeout_s: float, policy: RetryPolicy,
                 max_connections: int, rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.endpoint, self.policy = endpoint, policy
        self._key = api_key or None
        self._rng = rng or random.Random()
        self._sleep = sleep
        self.stats = ClientStats()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False, transport=transport,
        )

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    def scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    async def get_json(self, url: str, *, policy: RetryPolicy | None = None) -> tuple[int, Any]:
        """GET with retries (a refused connection is not retried): (status, decoded JSON or None)."""
        return await self._request("GET", url, None, policy or self.policy, self._status_and_json,
                                   retry_connect=False)

    async def post_json(self, url: str, body: dict[str, Any], *, policy: RetryPolicy | None = None
                        ) -> tuple[int, Any]:
        """POST with retries (a refused connection is not retried): (status, decoded JSON or None)."""
        return await self._request("POST", url, body, policy or self.policy, self._status_and_json,
                                   retry_connect=False)

    async def complete(self, api: str, body: dict[str, Any], *, policy: RetryPolicy | None = None,
                       logprobs_required: bool = True) -> Answer:
        """POST a completion and parse it, retrying what is worth retrying; RequestFailed when it cannot."""
        url = self.endpoint.api(ROUTES[api])
        self.stats.requests += 1
        return await self._request("POST", url, body, policy or self.policy,
                                   lambda response: self._answer(response, url, api, logprobs_required))

    async def _request(self, method: str, url: str, body: dict[str, Any] | None, policy: RetryPolicy,
                       accept: Callable[[httpx.Response], T | Failure], retry_connect: bool = True) -> T:
        waited, attempt = 0.0, 0
        while True:
            self.stats.attempts += 1
            try:
                response = await self._http.request(method, url, json=body)
                outcome = accept(response)
            except httpx.TimeoutException as exc:
                outcome = Failure("timeout", self.describe(exc), True)
            except httpx.ConnectError as exc:
                outcome = Failure("connect", self.describe(exc), retry_connect)
            except httpx.TransportError as exc:
                outcome = Failure("connection", self.describe(exc), True)
            if not isinstance(outcome, Failure):
                if attempt:
                    self.stats.retried += 1
                return outcome
            self.stats.count(outcome.kind)
            wait = next_wait(policy, attempt, waited, outcome.retry_after, self._rng) if outcome.retryable else None
            if wait is None:
                raise RequestFailed(outcome.what, attempt + 1, outcome.retryable, outcome.status)
            await self._sleep(wait)
            waited += wait
            attempt += 1

    def _status_and_json(self, response: httpx.Response) -> tuple[int, Any] | Failure:
        status = response.status_code
        if retryable_status(status):
            return Failure(f"http {status}", f"HTTP {status} from {response.request.url}: "
                                             f"{self.error_message(response)}", True, status,
                           retry_after_s(response.headers))
        try:
            return status, response.json()
        except ValueError:
            return status, None

    def _answer(self, response: httpx.Response, url: str, api: str, with_logprobs: bool) -> Answer | Failure:
        status = response.status_code
        if status != 200:
            retryable = retryable_status(status)
            return Failure(f"http {status}", f"HTTP {status} from {url}: {self.error_message(response)}", retryable,
                           status, retry_after_s(response.headers) if retryable else None)
        try:
            decoded = response.json()
        except ValueError:
            return Failure("not json", f"{url} answered with something that is not JSON: "
                                       f"{self.scrub(response.text[:200])!r}", False, status)
        try:
            return parse_answer(decoded, api, with_logprobs)
        except AnswerError as exc:
            return Failure("not an answer", f"{url}: {self.scrub(str(exc))}", False, status)

    def error_message(self, response: httpx.Response) -> str:
        """The server's own words: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, else the body's start."""
        try:
            data = response.json()
        except ValueError:
            data = None
        message: Any = None
        if isinstance(data, dict):
            error = data.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            message = message or data.get("detail") or data.get("message")
        if not isinstance(message, str):
            message = json.dumps(message) if message is not None else response.text[:200]
        return self.scrub(message.strip() or response.reason_phrase or "no message")

    def describe(self, exc: httpx.HTTPError) -> str:
        """An httpx error in a few words, e.g. 'ConnectError: [Errno 111] Connection refused'."""
        text = str(exc) or "no detail"
        return self.scrub(f"{type(exc).__name__}: {text}")


def with_client(endpoint: Endpoint, api_key: str | None, *, timeout_s: float, retries: int, connections: int,
                client_factory: Callable[..., ServerClient], work: Callable[[ServerClient], Awaitable[T]]) -> T:
    """Run `work` with a fresh client in its own event loop (one per level or unit: Ctrl-C ends it cleanly)."""
    policy = RetryPolicy(attempts=retries + 1)

    async def main() -> T:
        async with client_factory(endpoint, api_key, timeout_s=timeout_s, policy=policy,
                                  max_connections=connections, rng=random.Random()) as client:
            return await work(client)

    return asyncio.run(main())
