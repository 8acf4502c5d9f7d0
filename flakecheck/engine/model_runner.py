"""Packs one step's scheduled sequences into a ragged batch and runs the model on it."""

from __future__ import annotations

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.models import LlamaForCausalLM
from flakecheck.engine.sequence import Sequence
from flakecheck.kernels import AttentionBatch


def pack(scheduled: list[tuple[Sequence, int]]) -> tuple[ForwardBatch, list[Sequence]]:
    """No padding: every sequence's pending tokens, end to end, and the sequences that sample."""
    token_ids: list[int] = []
    positions: list[int] = []
    token_slots: list[int] = []
    query_starts = [0]
    slots, context_lens, sample_rows, sampling = [], [], [], []
    for seq, n in scheduled:
        start = seq.num_computed
        token_ids.extend(seq.token_ids[start : start + n])
        positions.extend(range(start, start + n))
        token_slots.extend([seq.slot] * n)
        query_starts.append(query_starts[-1] + n)
        slots.append(seq.slot)
        context_lens.append(start + n)
        if start + n == len(seq.token_ids):
            sample_rows.append(query_starts[-1] - 1)
            sampling.append(seq)
    attention = AttentionBatch(
        slots, query_starts, context_lens, torch.tensor(slots), torch.tensor(context_lens)
    )
    batch = ForwardBatch(
        torch.tensor(token_ids),
        torch.tensor(positions),
        torch.tensor(token_slots),
        attention,
        torch.tensor(sample_rows, dtype=torch.long),
    )
    return batch, sampling


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, list[Sequence]]:
        batch, sampling = pack(scheduled)
        return self.model.forward(batch, self.cache), sampling

    @torch.inference_mode()
    def prompt_logprobs(self, prompt_ids: list[int]) -> torch.Tensor:
        """fp32 log-probabilities [len(prompt), vocab] at every prompt position, in one prefill
        (what a scoring API returns, and what the parity test compares with transformers)."""
        from flakecheck.engine.sequence import SamplingParams

        seq = Sequence("prompt-logprobs", list(prompt_ids), SamplingParams(max_tokens=0))
        seq.slot = self.cache.allocate()
        try:
            self.cache.ensure_length(seq.num_prompt)
            batch, _ = pack([(seq, seq.num_prompt)])
            batch.sample_rows = torch.arange(seq.num_prompt)
            return self.model.forward(batch, self.cache)
        finally:
            self.cache.release(seq.slot)
