"""Packs steps' scheduled sequences into one ragged batch, plans it, runs the model, samples."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from flakecheck.engine.engine_core import Sampled, Scheduled
from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.models import LlamaForCausalLM
from flakecheck.engine.sampler import greedy_top2
from flakecheck.engine.sequence import SamplingParams, Sequence
from flakecheck.kernels import AttentionLayout, BatchLayout, Ops, Segment, StepPlan, StepShape
from flakecheck.kernels.policy import KernelPolicy


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


def pack(steps: Seq[PlannedStep], cache: KVCache, ops: Ops, group: int,
         every_row_samples: bool = False) -> ForwardBatch:
    """No padding: every step's sequences' pending tokens, end to end, step after step. Rows sample
    where a sequence reaches its last token (`every_row_samples`: all rows, to score a prompt)."""
    token_ids: list[int] = []
    positions: list[int] = []
    cache_rows: list[int] = []
    query_starts = [0]
    slots, context_lens, kv_splits, sample_rows, segments = [], [], [], [], []
    for step in steps:
        first_row, first_sample, first_seq = len(token_ids), len(sample_rows), len(slots)
        for seq, n in step.scheduled:
            start = seq.num_computed
            assert seq.slot is not None
            token_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            cache_rows.extend(cache.rows(seq.slot, start, start + n))
            query_starts.append(query_starts[-1] + n)
            slots.append(seq.slot)
            context_lens.append(start + n)
            kv_splits.append(step.plan.kv_split)
            if every_row_samples:
                sample_rows.extend(range(query_starts[-2], query_starts[-1]))
            elif start + n == len(seq.token_ids):
                sample_rows.append(query_starts[-1] - 1)
        segments.append(Segment((first_row, len(token_ids)), (first_sample, len(sample_rows)),
                                (first_seq, len(slots)), step.plan))
    attention = AttentionLayout(slots, query_starts, context_lens, kv_splits)
    all_sample = len(sample_rows) == len(token_ids)
    return ForwardBatch(
        torch.tensor(token_ids),
        torch.tensor(positions),
        torch.tensor(cache_rows),
        ops.attention_meta(attention, group, torch.device("cpu")),
        BatchLayout(segments, len(token_ids), len(sample_rows)),
        None if all_sample else torch.tensor(sample_rows, dtype=torch.long),
    )


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    def plan(self, scheduled: Scheduled, policy: KernelPolicy | None = None) -> PlannedStep:
        """The step's reduction orders, from its shape alone (once a step, for every layer); under the
        model's policy, or another the weights are prepared for."""
        return PlannedStep(scheduled, self.model.ops.plan_step(step_shape(scheduled), self.model.dims, policy))

    @torch.inference_mode()
    def forward(self, steps: Seq[PlannedStep]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (model dtype) and fp32 log-probabilities [sampling rows, vocab], steps in order."""
        batch = pack(steps, self.cache, self.model.ops, self.model.group)
        return self.model.forward(batch, self.cache)

    def run(self, steps: Seq[PlannedStep]) -> list[list[Sampled]]:
        """Each step's sampled tokens, in its sampling sequences' order."""
        logits, logprobs = self.forward(steps)
        ids, values, top1_logits = greedy_top2(logits, logprobs)
        sampled = [Sampled(i[0], i[1], v[0], v[1], lg) for i, v, lg in zip(ids, values, top1_logits)]
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
