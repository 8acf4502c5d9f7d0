"""Continuous batching: which sequences run this step, and how many of their tokens.

Running sequences go first (decodes take one token each, a chunked prefill continues), then
arrived requests are admitted in order while there is a free sequence slot and token budget.
With a budget (`max_num_batched_tokens`, chunked prefill) a prompt may take several steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from flakecheck.engine.sequence import SeqStatus, Sequence


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int | None = None,
                 on_admit: Callable[[Sequence], None] = lambda seq: None) -> None:
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.on_admit = on_admit  # gives the sequence its cache slot and any prefix-cache hit
        self.waiting: list[Sequence] = []  # by arrival step, then submission order
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        bisect.insort_right(self.waiting, seq, key=lambda s: s.arrival)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def next_arrival(self) -> int | None:
        return self.waiting[0].arrival if self.waiting else None

    def schedule(self, now: int) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to compute) for this step."""
        budget = self.max_num_batched_tokens if self.max_num_batched_tokens is not None else 1 << 62
        scheduled: list[tuple[Sequence, int]] = []
        for seq in self.running:
            if budget == 0:
                break
            n = min(seq.num_pending, budget)
            scheduled.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if self.waiting[0].arrival > now:
                break
            seq = self.waiting.pop(0)
            seq.status = SeqStatus.RUNNING
            self.on_admit(seq)
            self.running.append(seq)
            n = min(seq.num_pending, budget)
            scheduled.append((seq, n))
            budget -= n
        return scheduled

    def finish(self, seq: Sequence) -> None:
        seq.status = SeqStatus.FINISHED
        self.running.remove(seq)
