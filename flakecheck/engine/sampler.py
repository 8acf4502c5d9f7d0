"""Greedy sampling that keeps the evidence: the top-2 (id, logprob) of every sampled row."""

from __future__ import annotations

import torch


def greedy_top2(logits: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[list[int]], list[list[float]], list[float]]:
    """Per row of fp32 log-probabilities [rows, vocab]: ([top1_id, top2_id], [top1_lp, top2_lp]) and the
    raw logit of top-1 (the chosen token) from `logits` [rows, vocab] in the model dtype."""
    values, ids = torch.topk(logprobs, 2, dim=-1)
    top1_logits = logits.gather(1, ids[:, :1]).float().squeeze(1)
    return ids.tolist(), values.tolist(), top1_logits.tolist()
