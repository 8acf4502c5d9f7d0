"""Tensor parallelism as N ranks compute it, simulated on one device, bit for bit.

Megatron-style sharding, as vLLM and SGLang shard a Llama-family model:

- column-parallel projections (the fused qkv, gate+up) and the LM head: each rank owns a slice of the
  output columns (its query heads and KV heads; its part of the intermediate size; its part of the
  vocabulary) and runs its own GEMM over the whole K — so a split-K heuristic sees the shard's shape;
- row-parallel projections (o_proj, down_proj): each rank owns a slice of K (its heads' outputs, its part
  of the intermediate size) and computes a partial GEMM, rounded to the activation dtype as it leaves the
  rank; the all-reduce then sums the N partials in its own order;
- the vocab-parallel log-softmax combines each shard's max (exact) and sum of exponentials (fp32).

The all-reduce orders (`allreduce=` in a composition):

- `ring`: reduce-scatter then all-gather, as NCCL's ring. The hidden vector is cut into N chunks; chunk c's
  sum starts at rank c+1 and travels the ring c+2, ..., c, each hop adding its partial in fp32 and rounding
  the running sum to the activation dtype (NCCL reduces in the buffer's dtype). Each chunk sees another
  order of the ranks.
- `tree`: a binary tree over the ranks in rank order ((r0+r1)+(r2+r3)...), every inner sum rounded to the
  activation dtype.
- `oneshot`: every rank reads every partial and accumulates them in fp32 in rank order, one rounding at the
  end (vLLM's custom all-reduce for small messages).
- `auto`: what vLLM picks by message size (rows x hidden x bytes of the activation dtype): `oneshot` up to
  ONESHOT_MAX_BYTES for the TP size (its custom all-reduce's one-stage limits: 512 KiB up to 4 ranks,
  256 KiB up to 8), `ring` above (NCCL). A step's message size follows its rows, so the all-reduce too
  changes with the batch.

The fix, `tp-invariant` (a kernel policy, after TBIK): K is reduced in fixed TP_BLOCK-wide blocks whose fp32
partials are exchanged unrounded and summed in global block order, so no sum depends on how many ranks hold
the blocks; the log-softmax sums its exponentials in fixed VOCAB_BLOCK-wide blocks, combined in one fixed
tree. Every TP size that aligns the shards with the blocks gives the bits of TP 1 under this policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ALLREDUCES = ("auto", "ring", "tree", "oneshot")
TP_INVARIANT = "tp-invariant"  # the all-reduce of the tp-invariant policy: fp32 block partials, block order
NONE = "none"  # the all-reduce of TP 1: there is none
ONESHOT_MAX_BYTES = ((4, 512 * 1024), (8, 256 * 1024))  # (up to N ranks, largest one-shot message)
TP_BLOCK = 64  # K per fp32 partial of the tp-invariant matmul (a head's width, a GPU tile's BLOCK_K)
VOCAB_BLOCK = 32  # vocabulary entries per fp32 partial sum of the tp-invariant log-softmax


@dataclass(frozen=True)
class TensorParallel:
    """A step's tensor parallelism: how many ranks, and the all-reduce that sums their partials (resolved
    from `auto` for the step's message size; NONE at one rank)."""

    size: int = 1
    allreduce: str = NONE


@dataclass(frozen=True)
class ShardedDims:
    """What sharding a model needs to know of it."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    hidden: int
    act_bytes: int = 2  # bytes of an activation (the all-reduce's message size follows it)


def resolve_allreduce(name: str, size: int, message_bytes: int) -> str:
    """The all-reduce a step of `message_bytes` per row-parallel output uses at `size` ranks."""
    if size == 1:
        return NONE
    if name != "auto":
        return name
    for ranks, limit in ONESHOT_MAX_BYTES:
        if size <= ranks:
            return "oneshot" if message_bytes <= limit else "ring"
    return "ring"


def check_size(dims: ShardedDims, size: int, tp_invariant: bool = False) -> None:
    """ValueError naming the dimension when `size` ranks cannot shard the model (as vLLM refuses them): the
    query heads and the intermediate size must divide evenly; KV heads are split when the size divides them
    and replicated when they divide the size. Under the tp-invariant policy the shards must also hold whole
    blocks of its fixed order."""
    if size < 1:
        raise ValueError(f"tp must be >= 1, got {size}")
    if dims.heads % size:
        raise ValueError(f"tp={size} does not divide the model's {dims.heads} query heads (num_attention_heads)")
    if dims.intermediate % size:
        raise ValueError(f"tp={size} does not divide the model's intermediate size {dims.intermediate} "
                         "(intermediate_size)")
    kv = dims.kv_heads
    if (size <= kv and kv % size) or (size > kv and size % kv):
        raise ValueError(f"tp={size} neither divides nor is a multiple of the model's {kv} KV heads "
                         "(num_key_value_heads)")
    if tp_invariant and size > 1:
        for what, width, block in (("query heads' width (num_attention_heads x head_dim)", dims.heads * dims.head_dim,
                                    TP_BLOCK), ("intermediate size", dims.intermediate, TP_BLOCK),
                                   ("vocabulary", dims.vocab, VOCAB_BLOCK)):
            if width % (size * block):
                raise ValueError(f"tp={size} under the tp-invariant order: the {what} {width} does not split "
                                 f"into {size} shards of whole {block}-wide blocks")


def kv_heads_per_rank(kv_heads: int, size: int) -> int:
    """KV heads each rank holds: its share, or one replicated head when there are more ranks than heads."""
    return max(1, kv_heads // size)


def qkv_columns(dims: ShardedDims, size: int) -> list[torch.Tensor]:
    """Each rank's rows of the fused [q; k; v] weight: its query heads, then its KV head(s) of k and of v."""
    d, q_width, kv_width = dims.head_dim, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    q_per, kv_per = dims.heads // size, kv_heads_per_rank(dims.kv_heads, size)
    ranks = []
    for r in range(size):
        kv_first = r * dims.kv_heads // size  # its share's first head, or the one head it replicates
        q = torch.arange(r * q_per * d, (r + 1) * q_per * d)
        kv = torch.arange(kv_first * d, (kv_first + kv_per) * d)
        ranks.append(torch.cat((q, q_width + kv, q_width + kv_width + kv)))
    return ranks


def shard_bounds(width: int, size: int) -> list[tuple[int, int]]:
    """Rank r's slice of a dimension of `width`: equal shards (the last shorter where it does not divide, as a
    vocabulary padded to the TP size leaves its padding to the last rank)."""
    step = math.ceil(width / size)
    return [(min(width, r * step), min(width, (r + 1) * step)) for r in range(size)]


def all_reduce(partials: list[torch.Tensor], algorithm: str) -> torch.Tensor:
    """The sum of the ranks' partials (each [M, H] in the activation dtype) in `algorithm`'s order and
    precision; the result is in the activation dtype."""
    dtype = partials[0].dtype
    if len(partials) == 1:
        return partials[0]
    if algorithm == "oneshot":
        acc = partials[0].float()
        for p in partials[1:]:
            acc = acc + p.float()
        return acc.to(dtype)
    if algorithm == "tree":
        level = list(partials)
        while len(level) > 1:
            paired = [_hop(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = paired + ([level[-1]] if len(level) % 2 else [])
        return level[0]
    if algorithm == "ring":
        size, out = len(partials), torch.empty_like(partials[0])
        for c, (lo, hi) in enumerate(shard_bounds(partials[0].shape[-1], size)):
            acc = partials[(c + 1) % size][:, lo:hi]
            for step in range(2, size + 1):
                acc = _hop(acc, partials[(c + step) % size][:, lo:hi])
            out[:, lo:hi] = acc
        return out
    raise ValueError(f"unknown all-reduce {algorithm!r}; choose among {', '.join(ALLREDUCES[1:])}")


def _hop(acc: torch.Tensor, partial: torch.Tensor) -> torch.Tensor:
    """One reduction hop in the buffer's dtype: added in fp32, rounded back."""
    return (acc.float() + partial.float()).to(acc.dtype)


def vocab_parallel_log_softmax(logits: torch.Tensor, size: int, shard_sum) -> torch.Tensor:
    """fp32 log-softmax of logits [M, V] whose vocabulary is split over `size` ranks: the global max is the
    max of the shards' maxima (exact); each rank sums exp(logit - max) over its shard with `shard_sum`
    (fp32 [M, w] -> [M, 1], the policy's row reduction), and the shards' sums are added in rank order in fp32
    (an fp32 all-reduce of one value a row)."""
    logits32 = logits.float()
    bounds = shard_bounds(logits32.shape[-1], size)
    row_max = torch.stack([logits32[:, lo:hi].amax(-1) for lo, hi in bounds if hi > lo], -1).amax(-1, keepdim=True)
    total: torch.Tensor | None = None
    for lo, hi in bounds:
        if hi > lo:
            part = shard_sum(torch.exp(logits32[:, lo:hi] - row_max))
            total = part if total is None else total + part
    assert total is not None
    return logits32 - row_max - torch.log(total)


def blocked_log_softmax(logits: torch.Tensor, short_sum) -> torch.Tensor:
    """The tp-invariant log-softmax: exp(logit - max) summed in fixed VOCAB_BLOCK-wide blocks (each rank sums
    its own blocks), the block sums gathered and reduced by one fixed tree (`short_sum`) — the same order
    whatever the number of shards that hold the blocks."""
    logits32 = logits.float()
    rows, vocab = logits32.shape
    row_max = logits32.amax(-1, keepdim=True)
    exps = torch.exp(logits32 - row_max)
    pad = (-vocab) % VOCAB_BLOCK  # zeros add nothing: a vocabulary off the block grid still sums in blocks
    if pad:
        exps = torch.cat((exps, exps.new_zeros(rows, pad)), -1)
    blocks = exps.view(rows, -1, VOCAB_BLOCK).sum(-1)
    return logits32 - row_max - torch.log(short_sum(blocks))
