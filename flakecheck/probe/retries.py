"""Retrying one HTTP request: which failures are worth another attempt, and how long to wait.

Retried: timeouts, connection errors (refused, reset, closed before the answer), HTTP 408, 429 and
every 5xx. Not retried: any other 4xx (the request itself is wrong) and an answer that is not an
OpenAI completion (the server is not what we think). The wait before attempt k+1 is "full jitter"
exponential backoff, uniform(0, min(cap, base * 2**k)), and at least the server's Retry-After when
it sends one. Bounded twice: at most `attempts` tries, and at most `max_wait_s` seconds of waiting
in all; a Retry-After beyond what is left of that budget ends the retries at once.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

RETRY_STATUSES = frozenset({408, 429})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_s: float = 0.5
    cap_s: float = 30.0
    max_wait_s: float = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (0-based), before any Retry-After."""
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2 ** attempt))


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status <= 599


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The Retry-After header in seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def next_wait(policy: RetryPolicy, attempt: int, waited_s: float, retry_after: float | None,
              rng: random.Random) -> float | None:
    """How long to sleep before another attempt after failed attempt `attempt` (0-based), having
    already slept `waited_s`; None when the policy says to give up."""
    if attempt + 1 >= policy.attempts:
        return None
    wait = policy.backoff(attempt, rng)
    if retry_after is not None:
        wait = max(wait, retry_after)
    if waited_s + wait > policy.max_wait_s:
        return None
    return wait
