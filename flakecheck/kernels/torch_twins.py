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
  row and the vectorised order depends only on the row length. Later also `F.rms_norm` on fp32
  rows (ATen's fused kernel, the one native uses): widths 64, 100, 576, 960, every M in 1..1024,
  rows permuted, 1 and 2 threads.

Measured later, for a faster fixed-order twin (docs/kernels-performance.md has the timings):

* FBGEMM's fp16 GEMM (`torch.ops.quantized.linear_dynamic_fp16`: fp16 weight packed once, fp32
  activations, fp32 FMAs; the same call native's `Ops.linear` makes): predicted "row-invariant
  whenever a row goes through the same micro-kernel". Got, for M = 1..1024 on 4 shapes and 1 or
  2 threads: a row's result depends only on which register-block kernel computes it, and the
  1- and 2-row kernels differ from the 3- to 6-row ones, which agree with each other. FBGEMM
  cuts M into chunks of 120 rows and each chunk into kernels by a fixed table (AVX2: 6-row
  kernels plus one remainder kernel of M mod 6 rows for chunks of 30 rows or more, e.g.
  7 = 5 + 2, 14 = 6 + 6 + 2, 31 = 6x5 + 1), so the rows that vary are exactly those of a 1- or
  2-row remainder. Padding M up to the next M' with M' mod 6 in {0, 3, 4, 5} (at most 2 extra
  rows: 1 -> 3, 16 and 64 unchanged) puts every real row in a 3- to 6-row kernel: bitwise equal
  to the M=1024 rows for every M tested, at every row position; threads split columns only.
  This depends on FBGEMM's kernel table (AVX-512 has a different one; flakecheck pins FBGEMM to
  its AVX2 code), so the machine's self-check verifies the rule before a run uses it, and the twin
  falls back to an fp32 GEMM where it fails (flakecheck/kernels/paths.py).
* fp32 batched matmul once more, for attention by 64-key blocks: [G, M, 64] x [G, 64, 64] rows
  are bitwise equal for every G in 1..64 and every M >= 4 (M <= 3 differs), so query rows are
  padded to 4, not 8. A matmul over a key range padded with zero probabilities is *not* safe to
  trim (MKL changed a row at 193..199 keys of which 100 were nonzero), so the reduction over
  keys always runs over whole 64-key blocks, added in block order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flakecheck.kernels.fallbacks import TILE, lanes_sum
from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.native import scale_normed, soft_cap
from flakecheck.kernels.weights import Fp16Packed

ROW_BLOCK = 8  # rows of every fixed-order fp32 GEMM are padded to a multiple of this (see above)
FBGEMM_KERNEL_ROWS = 6  # rows of FBGEMM's widest AVX2 fp16 kernel; its 1- and 2-row kernels differ
ATTENTION_ROW_BLOCK = 4  # query rows of attention's batched matmuls are padded to a multiple of this
KEY_BLOCK = 64  # keys reduced by one batched matmul; a KV split is a whole number of these
SHORT_SUM = 256  # values a row reduction sums in one ATen call (short_sum)
NEG_INF = float("-inf")

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


def fbgemm_rows(m: int) -> int:
    """Rows to give FBGEMM's fp16 GEMM so that none of the first m lands in a 1- or 2-row kernel."""
    short = m % FBGEMM_KERNEL_ROWS
    return m + (3 - short if short in (1, 2) else 0)


def fbgemm_fixed_order_linear(x: torch.Tensor, pack: Fp16Packed) -> torch.Tensor:
    """x[M, K] @ weight[N, K].T + bias in x's dtype through FBGEMM's fp16 GEMM, every row computed
    by a 3- to 6-row kernel over the same K order whatever M is. Only where the machine's self-check
    verified the padding rule and the weight packed exactly (else the caller runs an fp32 GEMM).

    The values are those of a bf16 GEMM with fp32 accumulation: the weight is an exact
    power-of-two-scaled fp16 copy (weights.fp16_pack, shared with native: one copy, 2 bytes a
    parameter), products are exact in fp32, the bias is added in fp32 and the output rounded once."""
    m = x.shape[0]
    rows = fbgemm_rows(m)
    # the 2**-shift is exact (bf16/fp16 have no more range than fp32), fused with the cast; a
    # decode step makes ~600 of these calls, so the unpadded case skips the slicing (~3 us a view)
    if rows == m:
        x32 = torch.empty(x.shape, dtype=torch.float32)
        torch.mul(x, pack.unscale, out=x32)
        return torch.ops.quantized.linear_dynamic_fp16(x32, pack.packed).to(x.dtype)
    x32 = torch.zeros((rows, x.shape[1]), dtype=torch.float32)  # padding rows: computed, never read
    torch.mul(x, pack.unscale, out=x32[:m])
    return torch.ops.quantized.linear_dynamic_fp16(x32, pack.packed)[:m].to(x.dtype)


def split_k_matmul(x32: torch.Tensor, w32: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """fp32 split-K: one partial GEMM per K range, partials summed in split order (as a GPU's
    split-K reduction over an fp32 workspace does). Rows are padded to ROW_BLOCK, which makes each
    row's partials the same whatever M is (measured for 1..300 rows, strided K slices included).

    The equal-width ranges (all but a shorter last one, see profiles.split_bounds) run as one batched
    GEMM over views of x and w: MKL gives every batch entry the bits of the 2-D GEMM on its slice
    (tests/test_kernels_rows.py), in one call instead of one per split — the calls' fixed cost is
    most of a small partial GEMM's."""
    m = x32.shape[0]
    xp = pad_rows(x32, ROW_BLOCK)
    start, width = bounds[0][0], bounds[0][1] - bounds[0][0]
    n = 1
    while n < len(bounds) and bounds[n] == (start + n * width, start + (n + 1) * width):
        n += 1
    if n == 1:
        acc = F.linear(xp[:, start : start + width], w32[:, start : start + width])
    else:
        end = start + n * width
        partials = torch.bmm(xp[:, start:end].unflatten(1, (n, width)).transpose(0, 1),
                             w32[:, start:end].unflatten(1, (n, width)).permute(1, 2, 0))
        acc = partials[0] + partials[1]
        for partial in partials[2:]:
            acc.add_(partial)
    for lo, hi in bounds[n:]:
        acc.add_(F.linear(xp[:, lo:hi], w32[:, lo:hi]))
    return acc[:m]


def finish_linear(acc: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Epilogue: bias added in fp32, one rounding to the activation dtype."""
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(dtype)


def rmsnorm_from_sumsq(x32: torch.Tensor, sumsq: torch.Tensor, weight: torch.Tensor, eps: float,
                       dtype: torch.dtype) -> torch.Tensor:
    """Hugging Face's RMSNorm given each row's fp32 sum of squares: normalised in fp32, then scaled as the
    family does (native.scale_normed)."""
    inv = torch.rsqrt(sumsq / x32.shape[-1] + eps)
    return scale_normed(x32 * inv, weight, dtype)


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
        total = total + short_sum(torch.exp(c - row_max))
    return logits32 - row_max - torch.log(total)


def split_short_sum(values: torch.Tensor, splits: int) -> torch.Tensor:
    """Sum over the last dim (keepdim) cut into `splits` contiguous parts, each a short_sum, added in order:
    the sum of exponentials split_row_log_softmax makes, for one vocabulary shard."""
    width = values.shape[-1]
    step = math.ceil(width / max(splits, 1))
    acc = short_sum(values[..., :step])
    for lo in range(step, width, step):
        acc = acc + short_sum(values[..., lo : lo + step])
    return acc


def short_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (keepdim) in two levels of at most SHORT_SUM values each. ATen splits a single
    long row's sum across threads (a row of 49152 alone: other bits than inside a batch, and not even the
    same from call to call, measured at 2 threads); a reduction this short is always one thread's."""
    width = values.shape[-1]
    if width <= SHORT_SUM:
        return values.sum(-1, keepdim=True)
    blocks = -(-width // SHORT_SUM)
    padded = pad_rows(values, SHORT_SUM, dim=-1)
    partial = padded.unflatten(-1, (blocks, SHORT_SUM)).sum(-1)
    return short_sum(partial)


# ----------------------------------------------------------------------------------------------
# Attention: KV splits of a given number of keys (fixed under `invariant`, from the split-KV
# heuristic of the step under `splitk`), each reduced over whole KEY_BLOCK-key blocks in block
# order, splits combined in split order. Only the blocks up to the longest context of a call are
# computed: a block past a row's own length contributes exact zeros (probability 0, weight
# exp(-inf) = 0), so a row's bits do not depend on what else the call holds.


@dataclass(frozen=True)
class DecodeGroup:
    """Decoding sequences that share a split size, reduced in one batched call."""

    split_size: int
    rows: torch.Tensor | None  # their packed query rows (None: every row of the batch)
    slots: slice | torch.Tensor  # their KV slots: a slice when consecutive (a view, no gather)
    n: int
    longest: int
    bias: torch.Tensor | None


@dataclass(frozen=True)
class Prefill:
    split_size: int
    slot: int
    lo: int  # first packed row
    n: int
    context: int
    bias: torch.Tensor | None


@dataclass(frozen=True)
class SplitAttentionMeta:
    """What every layer of one forward pass reuses: decode groups, prefills and their masks."""

    decode: tuple[DecodeGroup, ...]
    prefills: tuple[Prefill, ...]
    tiled: bool = False  # every matmul over fixed TILE-row tiles, sums and maxima folded in lanes

    @classmethod
    def build(cls, layout: AttentionLayout, group: int, tiled: bool = False) -> SplitAttentionMeta:
        assert layout.kv_splits is not None
        row_block = TILE if tiled else ATTENTION_ROW_BLOCK
        by_split: dict[int, list[int]] = {}
        for i in layout.decode:
            by_split.setdefault(layout.kv_splits[i], []).append(i)
        decode = []
        for split_size, seqs in sorted(by_split.items()):
            block = _key_block(split_size)
            everyone = len(seqs) == layout.num_seqs
            rows = None if everyone else torch.tensor([layout.query_starts[i] for i in seqs])
            slot_list = [layout.slots[i] for i in seqs]
            consecutive = slot_list == list(range(slot_list[0], slot_list[0] + len(slot_list)))
            slots = slice(slot_list[0], slot_list[0] + len(slot_list)) if consecutive else torch.tensor(slot_list)
            ctx = layout.context_lens_t if everyone else layout.context_lens_t[seqs]
            longest = max(layout.context_lens[i] for i in seqs)
            bias = _mask_bias(ctx[:, None].expand(len(seqs), group), longest, block, row_block, layout.window)
            decode.append(DecodeGroup(split_size, rows, slots, len(seqs), longest, bias))
        prefills = []
        for i in layout.prefill:
            n, ctx_i, split_size = layout.query_len(i), layout.context_lens[i], layout.kv_splits[i]
            limits = torch.arange(ctx_i - n + 1, ctx_i + 1).repeat_interleave(group)[None, :]
            bias = _mask_bias(limits, ctx_i, _key_block(split_size), row_block, layout.window)
            prefills.append(Prefill(split_size, layout.slots[i], layout.query_starts[i], n, ctx_i, bias))
        return cls(tuple(decode), tuple(prefills), tiled)


def _key_block(split_size: int) -> int:
    return math.gcd(KEY_BLOCK, split_size)  # whole blocks a split (a test may use small splits)


def split_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: SplitAttentionMeta,
                    scale: float, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of packed q [T, H, D] over the cache, each sequence in splits of its own size.

    Decode rows (one query per sequence) go in one batched call per split size; each prefill chunk
    in its own. A query row's work is the same in either: its `group` query heads padded to whole
    row blocks, the same key blocks and splits, the same mask (keys at or before its own position)."""
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    out: torch.Tensor | None = None
    for g in meta.decode:
        block = _key_block(g.split_size)
        keys, values = _gather_kv_blocks(k_cache, v_cache, g.slots, g.longest, block)
        qd = q if g.rows is None else q.index_select(0, g.rows)
        o = _block_reduce(qd.view(g.n, kv_heads, group, head_dim), keys, values, g.bias, scale,
                          g.split_size // block, meta.tiled, softcap)
        o = o.reshape(g.n, heads, head_dim).to(q.dtype)
        if g.rows is None:
            return o
        if out is None:
            out = torch.empty_like(q)
        out.index_copy_(0, g.rows, o)
    if out is None:
        out = torch.empty_like(q)
    for p in meta.prefills:
        block = _key_block(p.split_size)
        keys, values = _gather_kv_blocks(k_cache, v_cache, slice(p.slot, p.slot + 1), p.context, block)
        # rows of one KV head: the n query positions times the `group` query heads sharing it
        n = p.n
        qg = q[p.lo : p.lo + n].view(n, kv_heads, group, head_dim).transpose(0, 1).reshape(1, kv_heads, n * group,
                                                                                          head_dim)
        o = _block_reduce(qg, keys, values, p.bias, scale, p.split_size // block, meta.tiled, softcap)
        out[p.lo : p.lo + n] = o.view(kv_heads, n, group, head_dim).transpose(0, 1).reshape(n, heads, head_dim)
    return out


def _mask_bias(limits: torch.Tensor, longest: int, block: int, row_block: int = ATTENTION_ROW_BLOCK,
               window: int | None = None) -> torch.Tensor | None:
    """[B, 1, blocks, Rp, block] fp32: 0 on the keys row r of sequence b sees (the first
    limits[b, r]; with a sliding `window`, only the last `window` of them), -inf elsewhere; None when every
    row sees every key of the blocks (adding 0.0 changes no score's bits that matter: only -0.0 becomes
    +0.0, and exp of either is 1). Padding rows see every key (their scores are 0: no 0/0)."""
    n_blocks = math.ceil(longest / block)
    limits = pad_rows(limits - n_blocks * block, row_block, dim=1) + n_blocks * block
    lows = None if window is None else (limits - window).clamp(min=0)
    if bool((limits >= n_blocks * block).all()) and (lows is None or not bool(lows.any())):
        return None
    key_pos = torch.arange(n_blocks * block).view(1, 1, n_blocks, 1, block)
    visible = key_pos < limits[:, None, None, :, None]
    if lows is not None:
        visible &= key_pos >= lows[:, None, None, :, None]
    return torch.where(visible, 0.0, NEG_INF)


def _gather_kv_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: slice | torch.Tensor, context: int,
                      block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [B, KVH, blocks, block, D] keys and values of `slots`, the context rounded up to whole
    blocks. Positions past the cache are zero; positions past a sequence's own length hold
    finite values (zeros or an earlier sequence's) and are masked: 0 * finite keeps sums exact."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    padded = math.ceil(context / block) * block
    take = min(padded, k_cache.shape[1])
    result = []
    for cache in (k_cache, v_cache):
        src = cache[slots, :take]  # a view for a slice of slots, a gather for a list
        buf = torch.empty(src.shape[0], kv_heads, padded, head_dim, dtype=torch.float32)
        buf[:, :, :take].copy_(src.transpose(1, 2))
        if take < padded:
            buf[:, :, take:].zero_()
        result.append(buf.view(src.shape[0], kv_heads, padded // block, block, head_dim))
    return result[0], result[1]


def _block_reduce(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
                  scale: float, per_split: int, tiled: bool = False, softcap: float | None = None) -> torch.Tensor:
    """qg [B, KVH, R, D] attends to keys/values [B, KVH, blocks, block, D] under the additive mask
    `bias` [B, 1, blocks, Rp, block] (None: nothing masked). Each split of `per_split` blocks
    takes its own max; its sum-exp and P @ V are the block results added in block order; the
    splits are then combined in split order, each rescaled to the row's global max
    (flash-decoding's reduction). Returns [B, KVH, R, D] fp32.

    `tiled` (the fallback invariant by construction): both matmuls over fixed TILE-row tiles of the
    query rows, and the maxima and sums over a block's keys folded in lanes."""
    b, kv_heads, rows, head_dim = qg.shape
    n_blocks = keys.shape[2]
    n_splits = math.ceil(n_blocks / per_split)
    qs = pad_rows(qg.float() * scale, TILE if tiled else ATTENTION_ROW_BLOCK, dim=2).unsqueeze(2)  # [B, KVH, 1, Rp, D]
    rp = qs.shape[3]
    scores = soft_cap(_matmul_rows(qs, keys.transpose(-1, -2), tiled), softcap)  # [B, KVH, blocks, Rp, block]
    if bias is not None:
        scores += bias
    # a maximum is exact in any order; a sum is not
    row_sum = (lambda t: lanes_sum(t).squeeze(-1)) if tiled else (lambda t: t.sum(-1))
    if n_splits == 1:
        # one split (contexts up to split_size): its max is the row's, no rescaling, and the
        # general path below reduces to this (weight exp(0) = 1 exactly); fewer, in-place ops
        # because a short decode step is dominated by per-op overhead
        p = scores.sub_(scores.amax(dim=(2, 4), keepdim=True)).exp_()
        sums = row_sum(p)  # [B, KVH, blocks, Rp]: one row of `block` keys, a fixed order
        outs = _matmul_rows(p, values, tiled)  # [B, KVH, blocks, Rp, D]
        sum_blocks, out_blocks = sums.unbind(2), outs.unbind(2)  # one call for all the views
        total, acc = sum_blocks[0], out_blocks[0]
        for sum_j, out_j in zip(sum_blocks[1:], out_blocks[1:]):  # block order
            total = total + sum_j
            acc = acc + out_j
        return (acc / total[..., None])[:, :, :rows]
    # blocks past the longest context are not computed: as exact zeros (and -inf maxima) they
    # would not change any sum, so the split structure only needs them as padding here
    extra = n_splits * per_split - n_blocks
    block_max = scores.amax(-1)  # [B, KVH, blocks, Rp]
    if extra:
        block_max = torch.cat((block_max, block_max.new_full((b, kv_heads, extra, rp), NEG_INF)), 2)
    split_max = block_max.view(b, kv_heads, n_splits, per_split, rp).amax(3)  # [B, KVH, splits, Rp]
    ref = torch.nan_to_num(split_max, neginf=0.0).repeat_interleave(per_split, dim=2)[:, :, :n_blocks]
    p = scores.sub_(ref[..., None]).exp_()
    sums = row_sum(p)
    outs = _matmul_rows(p, values, tiled)
    if extra:
        sums = torch.cat((sums, sums.new_zeros((b, kv_heads, extra, rp))), 2)
        outs = torch.cat((outs, outs.new_zeros((b, kv_heads, extra, rp, head_dim))), 2)
    sums = sums.view(b, kv_heads, n_splits, per_split, rp)
    outs = outs.view(b, kv_heads, n_splits, per_split, rp, head_dim)
    split_sum, split_out = sums[:, :, :, 0], outs[:, :, :, 0]
    for j in range(1, per_split):  # block order inside every split at once
        split_sum = split_sum + sums[:, :, :, j]
        split_out = split_out + outs[:, :, :, j]
    # some split holds a visible key (a row sees itself), so the max is finite and a masked split weighs 0
    weights = torch.exp(split_max - split_max.amax(2, keepdim=True))  # [B, KVH, splits, Rp]
    total, acc = split_sum[:, :, 0] * weights[:, :, 0], split_out[:, :, 0] * weights[:, :, 0, :, None]
    for c in range(1, n_splits):
        total = total + split_sum[:, :, c] * weights[:, :, c]
        acc = acc + split_out[:, :, c] * weights[:, :, c, :, None]
    return (acc / total[..., None])[:, :, :rows]


def _matmul_rows(a: torch.Tensor, b: torch.Tensor, tiled: bool) -> torch.Tensor:
    """a [B, KVH, X, Rp, I] @ b [B, KVH, blocks, I, J] -> [B, KVH, blocks, Rp, J]; `tiled`: every GEMM of
    the batch is one TILE-row tile of a's rows (a fixed shape whatever Rp is)."""
    if not tiled:
        return torch.matmul(a, b)
    *lead, rp, inner = a.shape
    tiles = a.reshape(*lead, rp // TILE, TILE, inner)
    out = torch.matmul(tiles, b.unsqueeze(3))  # [B, KVH, blocks, tiles, TILE, J]
    return out.flatten(3, 4)

