"""Packs one step's scheduled sequences into a ragged batch and runs the model on it."""

from __future__ import annotations

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.models import LlamaForCausalLM
from flakecheck.engine.sequence import SamplingParams, Sequence
from flakecheck.kernels import AttentionBatch


def pack(scheduled: list[tuple[Sequence, int]], cache: KVCache) -> tuple[ForwardBatch, list[Sequence]]:
    """No padding: every sequence's pending tokens, end to end, and the sequences that sample."""
    token_ids: list[int] = []
    positions: list[int] = []
    cache_rows: list[int] = []
    query_starts = [0]
    slots, context_lens, sample_rows, sampling = [], [], [], []
    for seq, n in scheduled:
        start = seq.num_computed
        assert seq.slot is not None
        token_ids.extend(seq.token_ids[start : start + n])
        positions.extend(range(start, start + n))
        cache_rows.extend(cache.rows(seq.slot, start, start + n))
        query_starts.append(query_starts[-1] + n)
        slots.append(seq.slot)
        context_lens.append(start + n)
        if start + n == len(seq.token_ids):
            sample_rows.append(query_starts[-1] - 1)
            sampling.append(seq)
    attention = AttentionBatch(
        slots, query_starts, context_lens, torch.tensor(slots), torch.tensor(context_lens)
    )
    every_row_samples = len(sample_rows) == len(token_ids)
    batch = ForwardBatch(
        torch.tensor(token_ids),
        torch.tensor(positions),
        torch.tensor(cache_rows),
        attention,
        None if every_row_samples else torch.tensor(sample_rows, dtype=torch.long),
    )
    return batch, sampling


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[Sequence]]:
        """fp32 log-probabilities [sampling sequences, vocab], and those sequences in row order."""
        batch, sampling = pack(scheduled, self.cache)
        return self.model.forward(batch, self.cache), sampling

    @torch.inference_mode()
    def prompt_logprobs(self, prompt_ids: list[int]) -> torch.Tensor:
        """fp32 log-probabilities [len(prompt), vocab] at every prompt position, in one prefill
        (what a scoring API returns, and what the parity test compares with transformers)."""
        seq = Sequence("prompt-logprobs", list(prompt_ids), SamplingParams(max_tokens=0))
        seq.slot = self.cache.allocate()
        try:
            self.cache.ensure_length(seq.num_prompt)
            batch, _ = pack([(seq, seq.num_prompt)], self.cache)
            batch.sample_rows = None
            return self.model.forward(batch, self.cache)
        finally:
            self.cache.release(seq.slot)
