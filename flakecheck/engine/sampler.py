"""Greedy sampling that keeps the evidence: the top-2 (id, logprob) of every sampled row."""

from __future__ import annotations

import torch


def greedy_top2(logprobs: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """Per row of fp32 log-probabilities [rows, vocab]: ([top1_id, top2_id], [top1_lp, top2_lp]).
    The chosen token is top-1."""
    values, ids = torch.topk(logprobs, 2, dim=-1)
    return ids.tolist(), values.tolist()
