"""Packs steps' scheduled sequences into one ragged batch, plans it, runs the model, samples."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from flakecheck.engine.engine_core import Sampled, Scheduled
from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.models import CausalLM
from flakecheck.engine.models.moe import MoeLM
from flakecheck.engine.routing import RowRouting
from flakecheck.engine.sampler import greedy_top2
from flakecheck.engine.sequence import SamplingParams, Sequence
from flakecheck.kernels import AttentionLayout, BatchLayout, Ops, Segment, StepPlan, StepShape
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.kernels.tensor_parallel import TensorParallel


@dataclass(frozen=True)
class PlannedStep:
    """One engine step: what it computes, and the reduction orders its shape selected."""

    scheduled: Scheduled
    plan: StepPlan


def step_shape(scheduled: Scheduled) -> StepShape:
    """Per sequence: its new rows and its context after the step; and how many sequences sample."""
    query_lens = tuple(n for _, n in scheduled)
    context_lens = tuple(seq.num_computed + n for seq, n in scheduled)
    samples = sum(seq.num_computed + n == len(seq.token_ids) for seq, n in scheduled)
    return StepShape(query_lens, context_lens, samples)


class BatchBuilder:
    """Packs one forward pass, step after step, no padding: each step's computed rows end to end (prefill
    chunks and decode tokens together), where they sample, and the plan they follow."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.token_ids: list[int] = []
        self.positions: list[int] = []
        self.cache_rows: list[int] = []
        self.query_starts = [0]
        self.slots: list[int] = []
        self.context_lens: list[int] = []
        self.kv_splits: dict[int | None, list[int]] = {}  # per window (None: full attention), each sequence's split
        self.sample_rows: list[int] = []
        self.segments: list[Segment] = []
        self.fanout: list[tuple[int, int]] = []
        self._first = (0, 0, 0)

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)

    def begin_step(self) -> None:
        self._first = (len(self.token_ids), len(self.sample_rows), len(self.slots))

    def add(self, seq: Sequence, start: int, end: int, plan: StepPlan) -> None:
        """Compute positions start..end-1 of `seq` under its step's `plan`; it attends to its keys 0..end-1 (those
        before `start` are in its cache slot, or written in this pass by `share`)."""
        assert seq.slot is not None and end > start
        self.token_ids.extend(seq.token_ids[start:end])
        self.positions.extend(range(start, end))
        self.cache_rows.extend(self.cache.rows(seq.slot, start, end))
        self.query_starts.append(self.query_starts[-1] + end - start)
        self.slots.append(seq.slot)
        self.context_lens.append(end)
        for window, split in plan.attention_splits:
            self.kv_splits.setdefault(window, []).append(split)

    def share(self, row: int, seq: Sequence, position: int) -> None:
        """Packed row `row` also writes its keys and values as `seq`'s at `position`."""
        assert seq.slot is not None
        self.fanout.append((row, seq.slot * self.cache.length + position))

    def sample(self, row: int) -> None:
        self.sample_rows.append(row)

    def end_step(self, plan: StepPlan) -> None:
        first_row, first_sample, first_seq = self._first
        self.segments.append(Segment((first_row, len(self.token_ids)), (first_sample, len(self.sample_rows)),
                                     (first_seq, len(self.slots)), plan))

    def build(self, ops: Ops, group: int) -> ForwardBatch:
        every_row = self.sample_rows == list(range(len(self.token_ids)))
        device = self.cache.device  # the step's indices live where the weights and the cache do

        def index(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        fanout = None
        if self.fanout:
            fanout = (index([r for r, _ in self.fanout]), index([c for _, c in self.fanout]))
        return ForwardBatch(
            index(self.token_ids),
            index(self.positions),
            index(self.cache_rows),
            {window: ops.attention_meta(AttentionLayout(self.slots, self.query_starts, self.context_lens, splits,
                                                        window), group, device)
             for window, splits in self.kv_splits.items()},
            BatchLayout(self.segments, len(self.token_ids), len(self.sample_rows)),
            None if every_row else index(self.sample_rows),
            fanout,
        )


def pack(steps: Seq[PlannedStep], cache: KVCache, ops: Ops, group: int,
         every_row_samples: bool = False) -> ForwardBatch:
    """Every step's sequences' pending tokens. Rows sample where a sequence reaches its last token
    (`every_row_samples`: all rows, to score a prompt)."""
    builder = BatchBuilder(cache)
    for step in steps:
        builder.begin_step()
        for seq, n in step.scheduled:
            first = builder.num_rows
            builder.add(seq, seq.num_computed, seq.num_computed + n, step.plan)
            if every_row_samples:
                for row in range(first, builder.num_rows):
                    builder.sample(row)
            elif seq.num_computed + n == len(seq.token_ids):
                builder.sample(builder.num_rows - 1)
        builder.end_step(step.plan)
    return builder.build(ops, group)


def sample(logits: torch.Tensor, logprobs: torch.Tensor, routing: list[RowRouting] | None = None) -> list[Sampled]:
    """One Sampled per row of a forward pass's logits (with its row's routing, for a mixture of experts)."""
    ids, values, top1_logits = greedy_top2(logits, logprobs)
    rows = routing if routing is not None else [None] * len(ids)
    return [Sampled(i[0], i[1], v[0], v[1], lg, r) for i, v, lg, r in zip(ids, values, top1_logits, rows)]


class ModelRunner:
    def __init__(self, model: CausalLM, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    def plan(self, scheduled: Scheduled, policy: KernelPolicy | None = None,
             tp: TensorParallel = TensorParallel()) -> PlannedStep:
        """The step's reduction orders, from its shape alone (once a step, for every layer); under the
        model's policy, or another the weights are prepared for; at `tp` ranks."""
        return PlannedStep(scheduled, self.model.ops.plan_step(step_shape(scheduled), self.model.dims, policy, tp))

    def forward(self, steps: Seq[PlannedStep]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (model dtype) and fp32 log-probabilities [sampling rows, vocab], steps in order."""
        return self.forward_batch(pack(steps, self.cache, self.model.ops, self.model.group))

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.forward(batch, self.cache)

    def sampled(self, batch: ForwardBatch) -> list[Sampled]:
        """The forward pass's sampling rows, sampled; a mixture of experts' rows with their routing (a dense
        model computes nothing more)."""
        logits, logprobs = self.forward_batch(batch)
        routing = None
        if isinstance(self.model, MoeLM) and logits.shape[0]:
            routing = self.model.routing(batch.sample_rows)
        return sample(logits, logprobs, routing)

    def run(self, steps: Seq[PlannedStep]) -> list[list[Sampled]]:
        """Each step's sampled tokens, in its sampling sequences' order."""
        sampled = self.sampled(pack(steps, self.cache, self.model.ops, self.model.group))
        per_step, start = [], 0
        for step in steps:
            n = sum(seq.num_computed + k == len(seq.token_ids) for seq, k in step.scheduled)
            per_step.append(sampled[start : start + n])
            start += n
        return per_step

    @torch.inference_mode()
    def prompt_logprobs(self, prompt_ids: list[int]) -> torch.Tensor:
        """fp32 log-probabilities [len(prompt), vocab] at every prompt position, in one prefill
        (what a scoring API returns, and what the parity test compares with transformers)."""
        seq = Sequence("prompt-logprobs", list(prompt_ids), SamplingParams(max_tokens=0))
        seq.slot = self.cache.allocate()
        try:
            self.cache.ensure_length(seq.num_prompt)
            shape = StepShape((seq.num_prompt,), (seq.num_prompt,), seq.num_prompt)  # every row samples
            step = PlannedStep([(seq, seq.num_prompt)], self.model.ops.plan_step(shape, self.model.dims))
            batch = pack([step], self.cache, self.model.ops, self.model.group, every_row_samples=True)
            return self.model.forward(batch, self.cache)[1]
        finally:
            self.cache.release(seq.slot)
