"""What the engine loop did: steps, sequences per step (the batch the kernels saw), requests, tokens.

`GET /stats` returns a snapshot, so a client can prove that concurrent requests really shared a
forward pass (`peak_running_seqs`, `running_seqs_histogram`) rather than trusting the load it sent.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from flakecheck.engine.engine_core import EngineStats


class BatchStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps = 0
        self.peak_running_seqs = 0
        self.running_seqs = Counter[int]()  # sequences in a step's forward pass -> how many steps
        self.submitted = self.finished = self.aborted = self.failed = 0
        self.active = 0
        self.engine = EngineStats()

    def record_step(self, engine: EngineStats) -> None:
        with self._lock:
            self.steps += 1
            self.running_seqs[engine.last_step_seqs] += 1
            self.peak_running_seqs = max(self.peak_running_seqs, engine.last_step_seqs)
            self.engine = EngineStats(**vars(engine))

    def count(self, event: str) -> None:
        """One request `submitted`, `finished`, `aborted` (client gone) or `failed` (engine error)."""
        with self._lock:
            setattr(self, event, getattr(self, event) + 1)
            self.active += 1 if event == "submitted" else -1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "steps": self.steps,
                "peak_running_seqs": self.peak_running_seqs,
                "running_seqs_histogram": {str(k): v for k, v in sorted(self.running_seqs.items())},
                "active_requests": self.active,
                "submitted_requests": self.submitted,
                "finished_requests": self.finished,
                "aborted_requests": self.aborted,
                "failed_requests": self.failed,
                "prompt_tokens": self.engine.prompt_tokens,
                "generated_tokens": self.engine.generated_tokens,
                "prefix_hit_tokens": self.engine.prefix_hit_tokens,
            }
