"""All Triton kernels of the two policies, in one module (as Thinking Machines' batch_invariant_ops).

* `matmul_persistent`: the fixed-order matmul. A persistent grid (one program per SM, looping
  over output tiles); BLOCK_K depends only on K, so a row's reduction order never depends on M
  (BLOCK_M/BLOCK_N may, as vLLM found). Each program stores the tile it computed, from the
  same program ids and offsets used for the loads.
* `matmul_splitk`: split-K. Program (m, n, s) reduces K range s into an fp32 workspace; the
  splits are summed in order afterwards.
* `rmsnorm`, `log_softmax`: one program per row, fixed block order.
* `attention_splits`: attention over the KV cache in key splits of a given size (fixed for
  `invariant`, from the split-KV heuristic for `splitk`); program (row, head, split) writes
  the split's max, sum and unnormalised output, combined in split order by `combine_splits`.

fp32 accumulation everywhere; fp32 dots in IEEE precision (never TF32); every launch passes
`enable_fp_fusion=FP_FUSION` (off: no multiply-add contracted into an FMA), so the bits do not follow
Triton's default, which changes in Triton 3.10. Under TRITON_INTERPRET=1
(tests on CPU) a tile's dot is an fp32 multiply-and-sum instead of `tl.dot`: the interpreter's bf16
dot is wrong, and its fp32 dot is numpy's BLAS, whose rows depend on the tile height.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from flakecheck.kernels.tiles import FP_FUSION, MatmulTiles, attention_warps, matmul_tiles

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_TENSOR_NUMEL = 1 << 20  # Triton's limit on a block's elements
SPLIT_BLOCK_K = 32  # the split-K kernel's K step: its splits are multiples of it


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a small persistent grid still exercises the tile loop


def fixed_block_k(k: int) -> int:
    """BLOCK_K from K alone: the one parameter of a row's reduction order."""
    return 64 if k >= 64 else max(16, triton.next_power_of_2(k))


def _mn_blocks(m: int, n: int, block_k: int) -> MatmulTiles:
    """Output tiles and warps: no row's reduction order depends on them (each output sums over K alone)."""
    if INTERPRET:
        # The interpreter pays per program and per loop trip in Python, hardly per element: wide tiles (SmolLM2's
        # LM head in 48 at one row, not 768), within Triton's limit on a block's elements (the fp32 product
        # block is BLOCK_M x BLOCK_K x BLOCK_N), and 4 or more a matrix, so that the persistent
        # tile loop still runs more than one where N allows.
        block_m = min(64, max(16, triton.next_power_of_2(m)))
        widest = MAX_TENSOR_NUMEL // (block_m * block_k)
        return MatmulTiles(block_m, max(16, min(widest, triton.next_power_of_2(n) // 4)), 4)
    return matmul_tiles(m)


def softmax_block(v: int) -> int:
    """The log-softmax's lanes: the vocabulary is read in blocks of this many columns."""
    return min(1024, triton.next_power_of_2(v))


@triton.jit
def _matmul_persistent_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                              HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in range(pid, num_tiles, NUM_PROGRAMS):
        rm = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                        other=0.0)
            b = tl.load(w_ptr + rn[None, :] * stride_wn + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K),
                        other=0.0)
            if UPCAST:
                acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
            else:
                acc = tl.dot(a, b, acc, input_precision="ieee")
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        # store the tile this program computed, with the offsets it loaded with
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_persistent(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K].T (+ bias), fixed reduction order per row."""
    x, w = _row_major(x), _row_major(w)
    m, k = x.shape
    n = w.shape[0]
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_k = fixed_block_k(k)
    block_m, block_n, warps = _mn_blocks(m, n, block_k)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    programs = max(1, min(tiles, _num_sms(x.device)))
    _matmul_persistent_kernel[(programs,)](
        x, w, bias if bias is not None else w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        NUM_PROGRAMS=programs, UPCAST=INTERPRET, num_warps=warps, enable_fp_fusion=FP_FUSION,
    )
    return y


@triton.jit
def _matmul_splitk_kernel(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, K_PER_SPLIT,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          UPCAST: tl.constexpr):
    pm, pn, ps = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = ps * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < k_hi),
                    other=0.0)
        b = tl.load(w_ptr + rn[None, :] * stride_wn + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < k_hi),
                    other=0.0)
        if UPCAST:
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    tl.store(ws_ptr + ps * M * N + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_splitk(x: torch.Tensor, w: torch.Tensor, splits: int, bias: torch.Tensor | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Split-K: `splits` fp32 partials over K ranges (multiples of 32), summed in split order."""
    x, w = _row_major(x), _row_major(w)
    m, k = x.shape
    n = w.shape[0]
    per_split = math.ceil(math.ceil(k / max(1, splits)) / SPLIT_BLOCK_K) * SPLIT_BLOCK_K
    splits = math.ceil(k / per_split)
    block_m, block_n, warps = _mn_blocks(m, n, SPLIT_BLOCK_K)
    ws = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), splits)
    _matmul_splitk_kernel[grid](x, w, ws, m, n, k, x.stride(0), w.stride(0), per_split,
                                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=SPLIT_BLOCK_K, UPCAST=INTERPRET,
                                num_warps=warps, enable_fp_fusion=FP_FUSION)
    acc = ws[0]
    for s in range(1, splits):
        acc = acc + ws[s]
    if bias is not None:
        acc = acc + bias.float()
    if out is None:
        return acc.to(x.dtype)
    return out.copy_(acc)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, H, eps, SPLIT_W, BLOCK: tl.constexpr, PARTS: tl.constexpr,
                    SCALE_FP32: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    sq = x * x
    # PARTS contiguous parts of the row, each reduced on its own, added in order (1: the fixed order)
    total = tl.sum(tl.where(cols < SPLIT_W, sq, 0.0), axis=0)
    for s in tl.static_range(1, PARTS):
        part = (cols >= s * SPLIT_W) & (cols < (s + 1) * SPLIT_W)
        total += tl.sum(tl.where(part, sq, 0.0), axis=0)
    inv = 1.0 / tl.sqrt(total / H + eps)
    normed = x * inv
    if not SCALE_FP32:  # the weight scales the values rounded to the model dtype (native.scale_normed)
        normed = normed.to(y_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, (w * normed).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, splits: int = 0,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm, one program a row; `splits` 0 is the fixed order, S >= 1 reduces a row in S parts."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = out if out is not None else torch.empty_like(x2)
    parts = max(splits, 1)
    _rmsnorm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, shape[-1], eps, math.ceil(shape[-1] / parts),
                                    BLOCK=triton.next_power_of_2(shape[-1]), PARTS=parts,
                                    SCALE_FP32=weight.dtype == torch.float32, enable_fp_fusion=FP_FUSION)
    return y.view(shape)


@triton.jit
def _log_softmax_kernel(x_ptr, y_ptr, V, SPLIT_W, BLOCK: tl.constexpr, PARTS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    top = float("-inf")
    total = 0.0
    for s in tl.static_range(PARTS):  # the fixed order is one part: the whole row
        lo = s * SPLIT_W
        hi = tl.minimum(V, lo + SPLIT_W)
        run_max = tl.full((BLOCK,), float("-inf"), tl.float32)
        run_sum = tl.zeros((BLOCK,), tl.float32)
        for v0 in range(lo, hi, BLOCK):  # online max and sum-exp, lane by lane, blocks in order
            x = tl.load(x_ptr + row * V + v0 + cols, mask=v0 + cols < hi, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, x)
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(x - safe)
            run_max = new_max
        part_max = tl.max(run_max, axis=0)
        part_sum = tl.sum(run_sum * tl.exp(run_max - part_max), axis=0)
        new_top = tl.maximum(top, part_max)  # parts combined in order, each rescaled to the running max
        total = total * tl.exp(top - new_top) + part_sum * tl.exp(part_max - new_top)
        top = new_top
    shift = top + tl.log(total)
    for v0 in range(0, V, BLOCK):
        x = tl.load(x_ptr + row * V + v0 + cols, mask=v0 + cols < V, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * V + v0 + cols, x - shift, mask=v0 + cols < V)


def log_softmax(logits: torch.Tensor, splits: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 log-softmax, one program a row; `splits` 0 is the fixed order, S >= 1 reduces in S parts."""
    shape = logits.shape
    x2 = logits.reshape(-1, shape[-1]).contiguous()
    y = out if out is not None else torch.empty(x2.shape, dtype=torch.float32, device=x2.device)
    parts = max(splits, 1)
    _log_softmax_kernel[(x2.shape[0],)](x2, y, shape[-1], math.ceil(shape[-1] / parts), BLOCK=softmax_block(shape[-1]),
                                        PARTS=parts, enable_fp_fusion=FP_FUSION)
    return y.view(shape)


@triton.jit
def _attention_split_kernel(q_ptr, k_ptr, v_ptr, row_slot_ptr, row_limit_ptr, row_first_ptr, m_ptr, l_ptr, o_ptr,
                            scale, softcap, H, KVH, cache_len, SPLIT, NUM_SPLITS,
                            D: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, CAPPED: tl.constexpr):
    row, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_head = head // (H // KVH)
    slot = tl.load(row_slot_ptr + row)
    limit = tl.load(row_limit_ptr + row)
    first = tl.load(row_first_ptr + row)  # the first key a sliding window leaves the row (0: every key)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (row * H + head) * D + d).to(tl.float32) * scale
    lo = split * SPLIT
    hi = tl.minimum(limit, lo + SPLIT)
    # blocks wholly before the window are skipped; the rest keep the split's block grid (a row's order
    # depends on its own position alone), so no block is all masked and no max is -inf - -inf
    start = lo + tl.maximum(first - lo, 0) // BLOCK_N * BLOCK_N
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros((D,), tl.float32)
    for n0 in range(start, hi, BLOCK_N):  # online softmax over fixed blocks of keys
        n = n0 + tl.arange(0, BLOCK_N)
        visible = (n < hi) & (n >= first)
        base = ((slot * cache_len + n) * KVH + kv_head) * D
        k = tl.load(k_ptr + base[:, None] + d[None, :], mask=visible[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1)
        if CAPPED:  # softcap * tanh(s / softcap), tanh from exp: (1 - e^-2|x|) / (1 + e^-2|x|) with x's sign
            x = s / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(x < 0, -t, t) * softcap
        s = tl.where(visible, s, float("-inf"))
        new_m = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - new_m)
        p = tl.exp(s - new_m)
        v = tl.load(v_ptr + base[:, None] + d[None, :], mask=visible[:, None], other=0.0).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = new_m
    out = (row * H + head) * NUM_SPLITS + split
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)
    tl.store(o_ptr + out * D + d, acc)


def attention_splits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, row_slots: torch.Tensor,
                     row_limits: torch.Tensor, scale: float, split_size: int, num_splits: int,
                     block_n: int = 64, row_firsts: torch.Tensor | None = None,
                     softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (row, head, split): max [T, H, S], sum [T, H, S], unnormalised output [T, H, S, D].
    A split outside a row's own keys (past them, or before its sliding window) is empty: max -inf, sum 0,
    output 0. `row_firsts`: each row's first visible key (None: 0)."""
    t, h, d = q.shape
    m = torch.empty(t, h, num_splits, dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    o = torch.empty(t, h, num_splits, d, dtype=torch.float32, device=q.device)
    grid = (t, h, num_splits)
    if row_firsts is None:
        row_firsts = torch.zeros_like(row_limits)
    _attention_split_kernel[grid](q.contiguous(), k_cache, v_cache, row_slots, row_limits, row_firsts, m, l_, o,
                                  scale, softcap or 1.0, h, k_cache.shape[2], k_cache.shape[1], split_size,
                                  num_splits, D=d, BLOCK_N=min(block_n, split_size), UPCAST=INTERPRET,
                                  CAPPED=softcap is not None, num_warps=attention_warps(d),
                                  enable_fp_fusion=FP_FUSION)
    return m, l_, o


def combine_splits(m: torch.Tensor, l_: torch.Tensor, o: torch.Tensor, dtype: torch.dtype,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Flash-decoding's reduction over splits, in split order, each rescaled to the global max."""
    top = m.amax(-1, keepdim=True)
    w = torch.exp(m - top)  # some split holds a visible key (a row sees itself): top is finite
    total, acc = l_[..., 0] * w[..., 0], o[..., 0, :] * w[..., 0:1]
    for s in range(1, m.shape[-1]):
        total = total + l_[..., s] * w[..., s]
        acc = acc + o[..., s, :] * w[..., s : s + 1]
    result = (acc / total[..., None]).to(dtype)
    return result if out is None else out.copy_(result)


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()
