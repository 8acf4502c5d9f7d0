"""Device profiles and the split heuristics the `splitk` policy derives from them.

A production GPU engine does not pick one reduction order: the GEMM library picks a kernel
configuration per problem shape, and the split of the K (or KV) range follows from how many
output tiles there are to keep the SMs busy. The heuristics here are deterministic functions of
the shape and the SM count, so one batch composition always gives one reduction order, and a
different composition (another batch size, another prefill length) generally gives another.

Matmul (`matmul_splits`): a cost model in the spirit of CUTLASS's split-K / stream-K selection.

* The tile height follows the M bucket, as cuBLAS heuristics and Triton autotune tables do:
  BM = next power of two >= M, clamped to [16, 128]; BN = 128 (64 when N is small).
* For each candidate split count S (1..16, each split at least 64 of K), the estimated time is
  the number of SM waves times the K-slice each program reduces, plus the cost of the fp32
  split reduction, which grows with M * N * S (partials are written and read back):

      time(S) = ceil(tiles * S / SMs) * BM * BN * ceil(K / S)
                + (S - 1) * (REDUCE_COST * M * N / SMs + SPLIT_SYNC_COST)

  and the smallest-time S wins (ties: fewer splits). The fixed per-split cost matters: without
  it the model is scale-free inside a tile bucket (M=16 with BM=16 and M=32 with BM=32 would
  always tie).
* Consequence: small M and large K get more splits (few tiles, cheap reduction); the reduction
  term makes the split count fall step by step as M grows inside one tile bucket, which is
  what makes decode at batch 1, 8, 16 and 32 pick different splits on SmolLM2's shapes (see
  `splits_table`). Without that term every M <= 16 would share a split count, and the policy
  would simulate less variance than real GPUs show (cuBLAS switches kernels between those
  batch sizes).

Attention (`attention_splits`): FlashAttention-2's `num_splits_heuristic`, fed with
(#sequences x KV heads x query blocks) against the SM count: no split once the grid fills 80%
of the SMs, else the smallest split count within 85% of the best wave efficiency. KV blocks of
64 keys (a small block so that the 30-300 token contexts a suite produces can split at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    sms: int


PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", 132),
    "a100": DeviceProfile("a100", 108),
    "h200": DeviceProfile("h200", 132),
    "l4": DeviceProfile("l4", 58),
}
DEFAULT_PROFILE = "h100"

MAX_SPLITS = 16
MIN_SPLIT_K = 64  # no split reduces fewer than 64 of K (one BK=64 step)
SPLIT_K_ALIGN = 32  # split boundaries fall on multiples of 32 (a BK granule)
REDUCE_COST = 256.0  # MAC-equivalents per fp32 partial element written and read back
SPLIT_SYNC_COST = 4096.0  # MAC-equivalents per extra split: workspace, semaphore, reduction launch
KV_BLOCK = 64
MAX_KV_SPLITS = 128
MAX_ROW_SPLITS = 4


def get_profile(name: str | None) -> DeviceProfile:
    """A named profile, or `sm<N>`: any GPU by its SM count (what `--profile auto` names the GPU it runs on)."""
    key = (name or DEFAULT_PROFILE).lower()
    if key in PROFILES:
        return PROFILES[key]
    if key.startswith("sm") and key[2:].isdigit() and int(key[2:]) > 0:
        return DeviceProfile(key, int(key[2:]))
    raise ValueError(f"unknown device profile {name!r}; choose one of {', '.join(PROFILES)}, sm<N> (a GPU with N "
                     "SMs) or auto")


def profile_for_sms(sms: int) -> str:
    """The name of the profile of a GPU with `sms` SMs: a named one when one has that count, else `sm<N>`."""
    named = [p.name for p in PROFILES.values() if p.sms == sms]
    return named[0] if named else f"sm{sms}"


def _tile_shape(m: int, n: int) -> tuple[int, int]:
    bm = min(128, max(16, 1 << max(0, m - 1).bit_length()))
    bn = 64 if n <= 1024 else 128
    return bm, bn


def matmul_splits(m: int, n: int, k: int, sms: int) -> int:
    """Split count S of a [m, k] x [k, n] matmul on a device with `sms` SMs (module docstring)."""
    bm, bn = _tile_shape(m, n)
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    max_splits = max(1, min(MAX_SPLITS, k // MIN_SPLIT_K))
    best, best_time = 1, math.inf
    for s in range(1, max_splits + 1):
        waves = math.ceil(tiles * s / sms)
        time = waves * bm * bn * math.ceil(k / s) + (s - 1) * (REDUCE_COST * m * n / sms + SPLIT_SYNC_COST)
        if time < best_time:
            best, best_time = s, time
    return best


def split_bounds(k: int, splits: int) -> list[tuple[int, int]]:
    """The K ranges of `splits` parts: equal slices rounded up to SPLIT_K_ALIGN, the last shorter."""
    if splits <= 1:
        return [(0, k)]
    step = math.ceil(math.ceil(k / splits) / SPLIT_K_ALIGN) * SPLIT_K_ALIGN
    return [(lo, min(k, lo + step)) for lo in range(0, k, step)]


def attention_splits(num_seqs: int, kv_heads: int, max_query_len: int, max_context: int, sms: int) -> int:
    """FlashAttention-2's split-KV count for one launch over the whole batch."""
    m_blocks = math.ceil(max_query_len / 64)
    grid = num_seqs * kv_heads * m_blocks
    n_blocks = math.ceil(max_context / KV_BLOCK)
    if grid >= 0.8 * sms:
        return 1
    max_splits = min(MAX_KV_SPLITS, sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))

    efficiency: dict[int, float] = {}
    for s in range(1, max_splits + 1):
        if eligible(s):
            waves = grid * s / sms
            efficiency[s] = waves / math.ceil(waves)
    best = max(efficiency.values(), default=1.0)
    return next((s for s, eff in efficiency.items() if eff >= 0.85 * best), 1)


def kv_chunk_size(max_context: int, splits: int) -> int:
    """Keys per split: the KV blocks shared out evenly across the splits."""
    n_blocks = math.ceil(max_context / KV_BLOCK)
    return max(1, math.ceil(n_blocks / max(1, splits))) * KV_BLOCK


def row_splits(rows: int, sms: int) -> int:
    """Split-reduction for norms and softmax rows: with too few rows to fill the SMs, each row is
    reduced by up to 4 programs (8 rows' worth of programs per SM is considered full)."""
    return max(1, min(MAX_ROW_SPLITS, sms // (8 * max(rows, 1))))


def splits_table(sms: int = 132) -> dict[str, dict[int, int]]:
    """Split counts on SmolLM2-135M's projections for the batch sizes a server sees (for docs/tests)."""
    shapes = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
              "lm_head": (49152, 576)}
    ms = (1, 8, 16, 32, 64, 30, 100, 300)
    return {name: {m: matmul_splits(m, n, k, sms) for m in ms} for name, (n, k) in shapes.items()}
