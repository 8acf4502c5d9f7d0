"""Routing as the engine records it: per sampled token of a mixture of experts, how near its router came to
another choice of experts, and the experts it chose.

A generated token's routing is that of the row whose logits chose it (the prompt's last row for the first
token, the previous token's row after): per sparse layer, the top-k experts (best first) and the gap between
the k-th and the (k+1)-th router probability; the token keeps the smallest gap over the layers and the layer
where it is. A different choice on an earlier prompt row reaches the token only through the keys and values,
and is not recorded. Dense models record nothing (the runner asks only a model with a router).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowRouting:
    margin: float  # the smallest k-th minus (k+1)-th router probability over the sparse layers
    layer: int  # the decoder layer (0-based) where that smallest margin is
    experts: tuple[tuple[int, ...], ...]  # per sparse layer, the k chosen experts, best first


def row_routing(layers: Sequence[int], margins: Sequence[torch.Tensor], chosen: Sequence[torch.Tensor],
                rows: torch.Tensor | None) -> list[RowRouting]:
    """Per row of `rows` (every row when None): its routing over the sparse `layers`, from each layer's last
    call (`margins` [rows] and `chosen` [rows, k] per layer, in layer order)."""
    margin = torch.stack(list(margins))  # [layers, rows]
    experts = torch.stack(list(chosen), dim=1)  # [rows, layers, k]
    if rows is not None:
        margin, experts = margin[:, rows], experts[rows]
    smallest, where = margin.min(dim=0)
    return [RowRouting(m, layers[w], tuple(tuple(k) for k in e))
            for m, w, e in zip(smallest.tolist(), where.tolist(), experts.tolist())]
