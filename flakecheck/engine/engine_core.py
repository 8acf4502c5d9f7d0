"""The scheduling state of one engine: its requests, scheduler, clock, KV slots and prefix cache.

An EngineCore proposes a step (which sequences, how many tokens each) and commits its results; it
never runs the model. `LLMEngine` pairs one core with a model runner. Simulated replay runs many
cores — one per composition, or one per case of a serial composition — whose steps share physical
forward passes: each core's numbers still come only from its own steps' plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.prefix_cache import CachedBlock, PrefixCache
from flakecheck.engine.routing import RowRouting
from flakecheck.engine.scheduler import Scheduler
from flakecheck.engine.sequence import LINEAGE_ROOT, Completion, SamplingParams, SeqStatus, Sequence


@dataclass(frozen=True)
class Request:
    request_id: Any
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    arrival: int = 0  # engine step at which the request may first be scheduled
    cache_salt: str | None = None  # requests with different salts never share prefix-cache blocks
    # simulated replay computes its rows before this position only and schedules the rest, which shapes their
    # steps: a filler whose length is fixed, nothing reading what it generates (under a prefix cache the caller
    # keeps computed the prompt blocks a computed request may load). None: every row is computed
    shape_from: int | None = None


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    peak_running: int = 0  # most sequences in one step
    last_step_seqs: int = 0  # sequences in the last step's forward pass (decodes and prefill chunks)


Scheduled = list[tuple[Sequence, int]]


@dataclass(frozen=True)
class Sampled:
    """The sampler's result for one sequence: greedy top-1 and the runner-up, top-1's raw logit, and the
    routing of the row that chose it (None for a dense model)."""

    top1: int
    top2: int
    top1_logprob: float
    top2_logprob: float
    top1_logit: float
    routing: RowRouting | None = None


class EngineCore:
    def __init__(self, cache: KVCache, eos_token_ids: frozenset[int], max_context: int, max_num_seqs: int = 1,
                 max_num_batched_tokens: int | None = None, prefix_cache: PrefixCache | None = None) -> None:
        self.cache, self.eos_token_ids, self.max_context = cache, eos_token_ids, max_context
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens, on_admit=self._admit)
        self.prefix_cache = prefix_cache
        self.clock = 0
        self.stats = EngineStats()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def prompts_done(self) -> bool:
        """Every request admitted and past its prompt: its prompt's KV is written (to the prefix cache too)."""
        return not self.scheduler.waiting and all(s.num_computed >= s.num_prompt for s in self.scheduler.running)

    def add_request(self, request: Request, context_name: str = "context") -> None:
        seq = Sequence(request.request_id, list(request.prompt_ids), request.params, request.arrival,
                       request.cache_salt, request.shape_from)
        if seq.max_length > self.max_context:
            raise ValueError(
                f"request {request.request_id!r}: {seq.num_prompt} prompt + {request.params.max_tokens} new "
                f"tokens exceed the model's {context_name} of {self.max_context}"
            )
        self.scheduler.add(seq)

    def _admit(self, seq: Sequence) -> None:
        seq.slot = self.cache.allocate()
        self.cache.ensure_length(seq.max_length)
        self.stats.prompt_tokens += seq.num_prompt
        if self.prefix_cache is not None:
            blocks = self.prefix_cache.lookup(seq.prompt_ids, seq.cache_salt)
            for i, block in enumerate(blocks):
                self.cache.load(seq.slot, i * self.prefix_cache.block_size, block.kv)
            seq.num_computed = seq.cached_prompt_tokens = len(blocks) * self.prefix_cache.block_size
            if blocks:
                seq.lineage = [None] * (seq.num_computed - 1) + [_loaded_lineage(blocks)]
            self.stats.prefix_hit_tokens += seq.cached_prompt_tokens

    def propose(self) -> Scheduled:
        """The next step's (sequence, tokens to compute); empty when nothing is left to run."""
        scheduled = self.scheduler.schedule(self.clock)
        if not scheduled:
            arrival = self.scheduler.next_arrival()
            if arrival is None:
                return []
            self.clock = max(self.clock, arrival)  # nothing running: skip ahead to the next arrival
            scheduled = self.scheduler.schedule(self.clock)
        return scheduled

    def commit(self, scheduled: Scheduled, sampled: list[Sampled]) -> list[Completion]:
        """Record a computed step: KV progress, the tokens of the sequences that sampled (in order),
        finished sequences (their slots freed). Returns the completions that finished."""
        self.clock += 1
        self.stats.steps += 1
        self.stats.peak_running = max(self.stats.peak_running, len(scheduled))
        self.stats.last_step_seqs = len(scheduled)
        sampling = []
        for seq, n in scheduled:
            was_prefilling = seq.num_computed < seq.num_prompt
            seq.num_computed += n
            if was_prefilling and seq.num_computed >= seq.num_prompt and self.prefix_cache is not None:
                self._remember_prefix(seq)
            if seq.num_computed == len(seq.token_ids):
                sampling.append(seq)
        assert len(sampling) == len(sampled), "one sampled token per sequence that reached its last token"
        finished = []
        for seq, s in zip(sampling, sampled):
            seq.token_ids.append(s.top1)
            seq.top1_ids.append(s.top1)
            seq.top1_logprobs.append(s.top1_logprob)
            seq.top2_ids.append(s.top2)
            seq.top2_logprobs.append(s.top2_logprob)
            seq.top1_logits.append(s.top1_logit)
            if s.routing is not None:
                seq.routing.append(s.routing)
            self.stats.generated_tokens += 1
            if s.top1 in self.eos_token_ids and not seq.params.ignore_eos:
                seq.finish_reason = "stop"
            elif seq.num_generated >= seq.params.max_tokens:
                seq.finish_reason = "length"
            else:
                continue
            self.scheduler.finish(seq)
            self.cache.release(seq.slot)
            finished.append(seq.completion())
        return finished

    def _unfinished(self, request_id: Any) -> Sequence | None:
        return next((s for s in (*self.scheduler.running, *self.scheduler.waiting) if s.request_id == request_id), None)

    def progress(self, request_id: Any) -> Completion | None:
        """What an unfinished request has generated so far (streaming, stop strings); None when it is
        finished or unknown."""
        seq = self._unfinished(request_id)
        return None if seq is None else seq.completion()

    def generated(self, request_id: Any) -> int | None:
        """How many tokens an unfinished request has generated so far; None when it is finished or unknown."""
        seq = self._unfinished(request_id)
        return None if seq is None else seq.num_generated

    def abort(self, request_id: Any, reason: str = "abort") -> Completion | None:
        """Finish an unfinished request now (a stop string matched, its client went away) and free its
        slot for the next step; its completion so far, or None when it is finished or unknown."""
        seq = self._unfinished(request_id)
        if seq is None:
            return None
        if seq.status is SeqStatus.WAITING:
            self.scheduler.waiting.remove(seq)
        else:
            self.scheduler.finish(seq)
            assert seq.slot is not None
            self.cache.release(seq.slot)
        seq.finish_reason = reason
        return seq.completion()

    def _remember_prefix(self, seq: Sequence) -> None:
        assert self.prefix_cache is not None and seq.slot is not None
        size = self.prefix_cache.block_size
        for index, key in self.prefix_cache.missing(seq.prompt_ids, seq.cache_salt):
            start, end = index * size, (index + 1) * size
            self.prefix_cache.insert(key, CachedBlock(self.cache.read(seq.slot, start, end), seq.lineage_before(end),
                                                      seq.lineage_before(start)))


def _loaded_lineage(blocks: list[CachedBlock]) -> bytes | None:
    """The lineage of a run of cached blocks: the last one's, when each block was computed on exactly the
    keys and values of the block before it; None (unknown) when the blocks came from different computations
    (two writers, or an evicted block rewritten) and so match no single one."""
    previous: bytes | None = LINEAGE_ROOT
    for block in blocks:
        if block.lineage is None or block.parent != previous:
            return None
        previous = block.lineage
    return previous
