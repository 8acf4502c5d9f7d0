"""Reduction orders shared by the torch twins of the `invariant` and `splitk` Triton kernels.

What was measured on this CPU (torch 2.13 CPU build, MKL 2024.2, AMD EPYC with AVX2, 2 threads)
before designing, on SmolLM2's shapes (K x N = 576x960, 576x576, 576x3072, 1536x576, 576x49152):

* fp32 `F.linear` (MKL sgemm): predicted "rows vary with M for small M and in remainder blocks".
  Got: M=1 (a GEMV) differs from every M >= 2 on every shape; M=2 and 3 differ everywhere; for
  M < 12 the rows of the last partial 4-row block differ (M=5: row 4; M=10: rows 8-9); for any
  M that is a multiple of 4 (and every M >= 12 tested) each row equals the M=512 result bitwise.
  Rows never depend on the *values* of other rows, and a row's position inside a block does not
  matter. So the fixed-order twin pads the rows to a multiple of ROW_BLOCK=8 and runs one GEMM.
* bf16 `F.linear` (no AVX512-BF16 here, so ATen's reference bf16 GEMM, fp32 accumulation):
  predicted "row-invariant, slow". Got: bitwise row-invariant for every M tested, and 3-8x
  slower than fp32 MKL from M=16 on. The twins do not rely on it: a CPU with AVX512-BF16 routes
  bf16 through oneDNN, whose blocking depends on M. They run fp32 GEMMs on an fp32 copy of
  the weight (made once per weight and cached), which is also what a GPU kernel does: bf16
  products are exact in fp32, accumulation is fp32, the output is rounded once.
* fp32 batched matmul ([B, M, 64] x [B, 64, 256] and [B, M, 256] x [B, 256, 64], attention's
  shapes): rows differ for M <= 3 at every B; for B = 1 it is the 2-D GEMM rule above. Padding
  the query rows to ROW_BLOCK makes them invariant.
* Row reductions over the last, contiguous dimension (`sum`, `amax`, `mean` over 576, 256;
  `log_softmax` over 49152): bitwise row-invariant for every M from 1 to 512 — one thread owns a
  row and the vectorised order depends only on the row length.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from flakecheck.kernels.ops import AttentionBatch

ROW_BLOCK = 8  # rows of every fixed-order GEMM are padded to a multiple of this (see above)
NEG_INF = float("-inf")

_fp32_weights: dict[int, torch.Tensor] = {}


def fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """An fp32 contiguous copy of `weight`, made once and dropped when the weight is freed.

    Costs 4 bytes per parameter (SmolLM2-135M: ~540 MB) on top of the bf16 weights."""
    if weight.dtype == torch.float32 and weight.is_contiguous():
        return weight
    key = id(weight)
    cached = _fp32_weights.get(key)
    if cached is None or cached.shape != weight.shape:
        cached = weight.detach().float().contiguous()
        _fp32_weights[key] = cached
        weakref.finalize(weight, _fp32_weights.pop, key, None)
    return cached


def pad_rows(x: torch.Tensor, block: int, dim: int = 0) -> torch.Tensor:
    """x with zero rows appended along `dim` up to a multiple of `block`."""
    extra = (-x.shape[dim]) % block
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat((x, x.new_zeros(shape)), dim=dim)


def fixed_order_matmul(x32: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    """fp32 x[M, K] @ w[N, K].T whose every row is computed the same way whatever M is."""
    m = x32.shape[0]
    return F.linear(pad_rows(x32, ROW_BLOCK), w32)[:m]


def split_k_matmul(x32: torch.Tensor, w32: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """fp32 split-K: one partial GEMM per K range, partials summed in split order (as a GPU's
    split-K reduction over an fp32 workspace does)."""
    lo, hi = bounds[0]
    acc = F.linear(x32[:, lo:hi], w32[:, lo:hi])
    for lo, hi in bounds[1:]:
        acc = acc + F.linear(x32[:, lo:hi], w32[:, lo:hi])
    return acc


def finish_linear(acc: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Epilogue: bias added in fp32, one rounding to the activation dtype."""
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(dtype)


def rmsnorm_from_sumsq(x32: torch.Tensor, sumsq: torch.Tensor, weight: torch.Tensor, eps: float,
                       dtype: torch.dtype) -> torch.Tensor:
    """Hugging Face's RMSNorm given each row's fp32 sum of squares: normalised in fp32, rounded to
    the model dtype, then scaled by the weight in the model dtype."""
    inv = torch.rsqrt(sumsq / x32.shape[-1] + eps)
    return weight * (x32 * inv).to(dtype)


def split_row_sum(values: torch.Tensor, splits: int) -> torch.Tensor:
    """Sum over the last dim cut into `splits` contiguous parts, partials added in order."""
    width = values.shape[-1]
    step = math.ceil(width / splits)
    acc = values[..., :step].sum(-1, keepdim=True)
    for lo in range(step, width, step):
        acc = acc + values[..., lo : lo + step].sum(-1, keepdim=True)
    return acc


def split_row_log_softmax(logits32: torch.Tensor, splits: int) -> torch.Tensor:
    """log-softmax whose max and sum-exp are reduced per vocabulary chunk, then combined."""
    width = logits32.shape[-1]
    step = math.ceil(width / splits)
    chunks = [logits32[..., lo : lo + step] for lo in range(0, width, step)]
    row_max = torch.stack([c.amax(-1) for c in chunks], -1).amax(-1, keepdim=True)
    total = torch.zeros_like(row_max)
    for c in chunks:
        total = total + torch.exp(c - row_max).sum(-1, keepdim=True)
    return logits32 - row_max - torch.log(total)


# ----------------------------------------------------------------------------------------------
# Attention: keys cut into chunks of a given size, each chunk reduced on its own (max, sum-exp,
# P @ V in fp32), chunks combined in index order. `invariant` uses a fixed chunk size; `splitk`
# takes the chunk size from the split-KV heuristic of the whole batch.


def chunked_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                      scale: float, chunk_size: int, row_block: int) -> torch.Tensor:
    """Causal attention of packed q [T, H, D] over the cache, all reductions in fp32.

    Decode rows (one query per sequence) go in one batched call; each prefill chunk in its own.
    A query row's work is the same in either: its `group` query heads padded to whole row blocks,
    the same key chunks, the same mask (keys at or before its own position)."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    decode = [i for i in range(batch.num_seqs) if batch.query_len(i) == 1]
    if decode:
        rows = torch.tensor([batch.query_starts[i] for i in decode]) if len(decode) < batch.num_seqs else None
        ctx = batch.context_lens_t if rows is None else batch.context_lens_t[decode]
        slots = batch.slots_t if rows is None else batch.slots_t[decode]
        qd = q if rows is None else q[rows]
        keys, values = _gather_kv(k_cache, v_cache, slots, max(batch.context_lens[i] for i in decode), chunk_size)
        qg = qd.view(len(decode), kv_heads, group, head_dim)
        limits = ctx[:, None].expand(len(decode), group)
        o = _chunk_reduce(qg, keys, values, limits, scale, chunk_size, row_block)
        o = o.reshape(len(decode), heads, head_dim).to(q.dtype)
        if rows is None:
            out = o
        else:
            out[rows] = o
    for i in range(batch.num_seqs):
        n = batch.query_len(i)
        if n == 1:
            continue
        lo, ctx_i = batch.query_starts[i], batch.context_lens[i]
        keys, values = _gather_kv(k_cache, v_cache, batch.slots_t[i : i + 1], ctx_i, chunk_size)
        # rows of one KV head: the n query positions times the `group` query heads sharing it
        qg = q[lo : lo + n].view(n, kv_heads, group, head_dim).transpose(0, 1).reshape(1, kv_heads, n * group, head_dim)
        limits = torch.arange(ctx_i - n + 1, ctx_i + 1).repeat_interleave(group)[None, :]
        o = _chunk_reduce(qg, keys, values, limits, scale, chunk_size, row_block)
        out[lo : lo + n] = o.view(kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, heads, head_dim)
    return out


def _gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, context: int,
               chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [B, KVH, chunks, chunk_size, D] keys and values of `slots`, the context rounded up to
    whole chunks. Positions past the cache are zero; positions past a sequence's own length hold
    finite values (zeros or an earlier sequence's) and are masked: 0 * finite keeps sums exact."""
    b, kv_heads, head_dim = slots.shape[0], k_cache.shape[2], k_cache.shape[3]
    padded = math.ceil(context / chunk_size) * chunk_size
    take = min(padded, k_cache.shape[1])
    make = torch.empty if take == padded else torch.zeros
    result = []
    for cache in (k_cache, v_cache):
        buf = make(b, kv_heads, padded, head_dim, dtype=torch.float32)
        buf[:, :, :take].copy_(cache[slots, :take].transpose(1, 2))
        result.append(buf.view(b, kv_heads, padded // chunk_size, chunk_size, head_dim))
    return result[0], result[1]


def _chunk_reduce(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, limits: torch.Tensor,
                  scale: float, chunk_size: int, row_block: int) -> torch.Tensor:
    """qg [B, KVH, R, D] attends to keys/values [B, KVH, chunks, C, D]; row r of sequence b sees
    the first limits[b, r] keys. Every chunk is reduced on its own (one batched matmul over all
    chunks), then the chunks are combined in index order. Returns [B, KVH, R, D] fp32."""
    rows = qg.shape[2]
    qs = pad_rows(qg.float() * scale, row_block, dim=2).unsqueeze(2)  # [B, KVH, 1, Rp, D]
    limits = pad_rows(limits, row_block, dim=1).clamp(min=1)  # padded rows see one key: no 0/0
    n_chunks = keys.shape[2]
    key_pos = torch.arange(n_chunks * chunk_size).view(1, 1, n_chunks, 1, chunk_size)
    bias = torch.where(key_pos < limits[:, None, None, :, None], 0.0, NEG_INF)  # [B, 1, chunks, Rp, C]
    scores = torch.matmul(qs, keys.transpose(-1, -2)) + bias  # [B, KVH, chunks, Rp, C]
    m = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - torch.nan_to_num(m, neginf=0.0))
    sums = p.sum(-1, keepdim=True)
    outs = torch.matmul(p, values)  # [B, KVH, chunks, Rp, D]
    if n_chunks == 1:  # the general combine below with one chunk: weight exp(0) = 1 exactly
        return (outs[:, :, 0] / sums[:, :, 0])[:, :, :rows]
    # Flash-decoding's reduction over splits, in split order, each rescaled to the global max
    # (chunk 0 is always visible, so the max is finite and a masked chunk weighs exp(-inf) = 0)
    weights = torch.exp(m - m.amax(2, keepdim=True))
    total, acc = sums[:, :, 0] * weights[:, :, 0], outs[:, :, 0] * weights[:, :, 0]
    for c in range(1, n_chunks):
        total = total + sums[:, :, c] * weights[:, :, c]
        acc = acc + outs[:, :, c] * weights[:, :, c]
    return (acc / total)[:, :, :rows]
