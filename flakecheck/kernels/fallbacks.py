"""Kernels invariant by construction, for a machine where the measured rules of torch_twins fail.

Every GEMM here is called with one fixed shape, strides and alignment whatever the batch holds: rows go in
tiles of TILE through a fresh buffer (a tile of 16 fp32 rows spans a multiple of 64 bytes, so every tile
starts on a cache line), or one row at a time through one reused buffer. Every sum over a row is written as
elementwise adds over fixed lanes in a fixed order, which no library reorders (a maximum is exact in any
order). A row's bits then depend only on the row (and, in a tile, on its position there, which the
self-check verifies). Slower than the fast paths; used only where the self-check finds those wrong.
"""

from __future__ import annotations

import torch

TILE = 16


def tiled_matmul(x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    """fp32 x[M, K] @ w[N, K].T, one [TILE, K] x [K, N] GEMM per tile of a zero-padded copy of x."""
    m, k = x32.shape
    rows = -(-m // TILE) * TILE
    tiles = torch.zeros((rows, k), dtype=torch.float32)
    tiles[:m] = x32
    out = torch.empty((rows, w32.shape[0]), dtype=torch.float32)
    wt = w32.t()
    for lo in range(0, rows, TILE):
        torch.mm(tiles[lo : lo + TILE], wt, out=out[lo : lo + TILE])
    return out[:m]


def rowwise_matmul(x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    """fp32 x[M, K] @ w[N, K].T one row a call, each through the same one-row buffers."""
    m, k = x32.shape
    row = torch.empty((1, k), dtype=torch.float32)
    result = torch.empty((1, w32.shape[0]), dtype=torch.float32)
    out = torch.empty((m, w32.shape[0]), dtype=torch.float32)
    wt = w32.t()
    for i in range(m):
        row.copy_(x32[i : i + 1])
        torch.mm(row, wt, out=result)
        out[i] = result[0]
    return out


def split_matmul(x32: torch.Tensor, w32: torch.Tensor, bounds: list[tuple[int, int]], rowwise: bool) -> torch.Tensor:
    """Split-K: each K range's partial GEMM through tiled_matmul (or rowwise_matmul), partials added in order."""
    gemm = rowwise_matmul if rowwise else tiled_matmul
    acc: torch.Tensor | None = None
    for lo, hi in bounds:
        part = gemm(x32[:, lo:hi], w32[:, lo:hi])
        acc = part if acc is None else acc.add_(part)
    assert acc is not None
    return acc


def lanes(width: int) -> int:
    """Lanes a row of `width` is folded into: a power of two, from the width alone."""
    target = max(1, min(256, width // 8))
    return 1 << (target.bit_length() - 1)


def lanes_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (keepdim): W cut into columns of lanes(W) (zero-padded), added column after
    column, then the lanes folded in halves. Elementwise adds only, so the order is fixed."""
    width = values.shape[-1]
    n = lanes(width)
    pad = (-width) % n
    if pad:
        values = torch.cat((values, values.new_zeros((*values.shape[:-1], pad))), dim=-1)
    cols = values.unflatten(-1, (-1, n))
    acc = cols[..., 0, :].clone()
    for j in range(1, cols.shape[-2]):
        acc.add_(cols[..., j, :])
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc


def lanes_log_softmax(logits32: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """log-softmax over the last dim whose sum-exp is folded in lanes, per vocabulary part
    (`splits` contiguous parts, combined in order, as the split-row order asks)."""
    width = logits32.shape[-1]
    step = -(-width // splits)
    chunks = [logits32[..., lo : lo + step] for lo in range(0, width, step)]
    row_max = logits32.amax(-1, keepdim=True)
    total = torch.zeros_like(row_max)
    for c in chunks:
        total = total + lanes_sum(torch.exp(c - row_max))
    return logits32 - row_max - torch.log(total)


def lanes_split_sum(values: torch.Tensor, splits: int) -> torch.Tensor:
    """Sum over the last dim in `splits` contiguous parts, each folded in lanes, parts added in order."""
    width = values.shape[-1]
    step = -(-width // splits)
    acc = lanes_sum(values[..., :step])
    for lo in range(step, width, step):
        acc = acc + lanes_sum(values[..., lo : lo + step])
    return acc
