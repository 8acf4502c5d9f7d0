"""Probes of row invariance: the same rows computed in two batch situations that must not matter.

A probe returns the largest absolute difference between the two (0.0: bitwise equal). Each takes an
`Ops` (a policy on a backend, with its kernel paths) and the model's shapes, so the self-check probes the
shapes a run really uses, and `flakecheck kernels check` the default model's.

- rows: every row of a block computed alone, and in batches of 2..33 rows at the start and end of the
  block, in reverse order, twice, and from a misaligned copy, against one batch of the whole block — what
  simulated replay needs of a row-wise op (a row's bits do not depend on what else the call holds). The
  compiled Triton matmuls also get batches on both sides of every M where their tiles (and with them the
  tensor-core instruction) change (flakecheck/kernels/tiles.py), in a block tall enough to hold them;
- attention: a sequence decoded alone against the same sequence inside decode batches and beside a
  prefill; with `axes` also a prefill in chunks against one prefill, and decode against prefill rows —
  what the fixed-order policy promises besides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.tiles import boundary_rows
from flakecheck.kernels.weights import LinearWeights

BATCHES = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 33)
BLOCK_ROWS = 40
# Under the Triton interpreter (numpy, program by program: a second or more a GEMM of SmolLM2's) the rows probe
# takes fewer batches: one row alone at the block's start, middle and end, and batches of 2, 3, 16 and 33 (the
# smallest batch, an odd height, a full tile of 16 rows, and past two tiles) — 15 calls, not 66.
LIGHT_BATCHES = (1, 2, 3, 16, 33)
Probe = Callable[[Ops], float]


@dataclass(frozen=True)
class ProbeDims:
    """The reduction shapes of a model that the probes cover."""

    projections: tuple[tuple[int, int], ...]  # (N, K) of every projection
    lm_head: tuple[int, int]
    heads: int
    kv_heads: int
    head_dim: int
    norm_widths: tuple[int, ...]  # RMSNorm widths: the hidden size (and head_dim with q/k norms)
    windows: tuple[int, ...] = ()  # sliding windows of the layers that have one: attention is probed under each

    @property
    def vocab(self) -> int:
        return self.lm_head[0]


# SmolLM2-135M-Instruct, the default model
SMOLLM2 = ProbeDims(projections=((960, 576), (576, 576), (3072, 576), (576, 1536)), lm_head=(49152, 576),
                    heads=9, kv_heads=3, head_dim=64, norm_widths=(576,))


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"probe shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if torch.equal(a, b):
        return 0.0
    d = (a.double() - b.double()).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, light: bool = False,
         extra: tuple[int, ...] = ()) -> float:
    """Row invariance of a row-wise op over the block x (BLOCK_ROWS rows); `light`: LIGHT_BATCHES; `extra`: more
    batch sizes (x is repeated down to hold the largest)."""
    if extra and max(extra) > x.shape[0]:
        x = x.repeat(-(-max(extra) // x.shape[0]), *([1] * (x.dim() - 1)))
    whole = fn(x)
    n = x.shape[0]
    worst = diff(fn(x), whole)  # the same call twice: a kernel whose threads race shows here or below
    for m in sorted({*(LIGHT_BATCHES if light else BATCHES), *extra}):
        # one row alone is where libraries change strategy (a GEMV, a reduction split across threads): all
        alone = sorted({0, n // 2, n - 1}) if light else range(n)
        for lo in alone if m == 1 else sorted({0, n - m}):
            worst = max(worst, diff(fn(x[lo : lo + m]), whole[lo : lo + m]))
    worst = max(worst, diff(fn(x.flip(0)).flip(0), whole))
    buffer = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    buffer[1:] = x.flatten()
    return max(worst, diff(fn(buffer[1:].view(x.shape)), whole))


def random(gen: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0,
           device: torch.device | str = "cpu") -> torch.Tensor:
    """Drawn on the CPU (the same numbers on every device), then moved."""
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def packable_weight(gen: torch.Generator, n: int, k: int, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """A weight whose magnitudes span four binades and both signs: it packs exactly into fp16 (so the
    fp16 GEMM path is the one probed, as for a real model's weights). Cheap to make at the LM head's size."""
    weight = torch.empty(n, k).uniform_(1.0 / 16, 1.0, generator=gen)
    weight[::2].neg_()
    return weight.to(device=device, dtype=dtype)


def linear_rows(ops: Ops, weights: LinearWeights, order: int, x: torch.Tensor, light: bool = False) -> float:
    extra = boundary_rows(ops.executor.name, interpreted=getattr(ops.executor, "interpreted", False))
    return rows(lambda r: ops.linear(r, weights, groups=((order, slice(None)),)), x, light, extra)


def rmsnorm_rows(ops: Ops, weight: torch.Tensor, order: int, x: torch.Tensor, light: bool = False) -> float:
    return rows(lambda r: ops.rmsnorm(r, weight, 1e-5, groups=((order, slice(None)),)), x, light)


def log_softmax_rows(ops: Ops, order: int, x: torch.Tensor, light: bool = False) -> float:
    return rows(lambda r: ops.log_softmax(r, groups=((order, slice(None)),)), x, light)


@dataclass
class KVCacheProbe:
    """Random keys, values and queries of `slots` sequences of up to `length` positions."""

    k: torch.Tensor
    v: torch.Tensor
    q: torch.Tensor  # [slots, length, heads, head_dim]: the query of slot s at position p
    contexts: list[int]
    scale: float

    @classmethod
    def make(cls, gen: torch.Generator, dims: ProbeDims, dtype: torch.dtype, device: torch.device | str = "cpu",
             slots: int = 17, length: int = 640, probed: int = 520) -> KVCacheProbe:
        k = random(gen, slots, length, dims.kv_heads, dims.head_dim, dtype=dtype, device=device)
        v = random(gen, slots, length, dims.kv_heads, dims.head_dim, dtype=dtype, device=device)
        q = random(gen, slots, length, dims.heads, dims.head_dim, dtype=dtype, device=device)
        contexts = [int(c) for c in torch.randint(20, length, (slots,), generator=gen)]
        contexts[0] = probed  # the probed sequence spans several splits of 64..256 keys
        return cls(k, v, q, contexts, dims.head_dim**-0.5)

    def run(self, ops: Ops, seqs: list[tuple[int, int, int]], split: int | None,
            window: int | None = None) -> list[torch.Tensor]:
        """(slot, new rows, context) per sequence as one step, every sequence `split` keys a split (None: as
        the policy plans the step), over a sliding `window` if given."""
        q = torch.cat([self.q[s, c - n : c] for s, n, c in seqs])
        layout = AttentionLayout.of(seqs, None if split is None else [split] * len(seqs), window)
        out = ops.attention(q, self.k, self.v, layout, self.scale)
        return [out[layout.query_starts[i] : layout.query_starts[i + 1]] for i in range(len(seqs))]


def attention_rows(ops: Ops, kv: KVCacheProbe, split: int | None, window: int | None = None) -> float:
    """Each of 16 decoding sequences alone against inside the batch, at the front and at the back, and a
    prefill's rows alone against beside decoding sequences."""
    probe = (0, 1, kv.contexts[0])
    others = [(s, 1, kv.contexts[s]) for s in range(1, len(kv.contexts))]
    seqs = [probe] + others[:15]
    together = kv.run(ops, seqs, split, window)
    worst = max(diff(together[i], kv.run(ops, [seq], split, window)[0]) for i, seq in enumerate(seqs))
    worst = max(worst, diff(kv.run(ops, others[:7] + [probe], split, window)[-1], together[0]))
    prefill = (0, 96, kv.contexts[0])
    alone = kv.run(ops, [prefill], split, window)[0]
    return max(worst, diff(kv.run(ops, others[:3] + [prefill] + others[3:6], split, window)[3], alone))


def attention_chunking(ops: Ops, kv: KVCacheProbe, split: int | None, window: int | None = None) -> float:
    """A prefill in chunks of 61 rows (each seeing the keys before it) against one prefill."""
    ctx = kv.contexts[0]
    whole = kv.run(ops, [(0, ctx, ctx)], split, window)[0]
    parts = [kv.run(ops, [(0, min(ctx, lo + 61) - lo, min(ctx, lo + 61))], split, window)[0]
             for lo in range(0, ctx, 61)]
    return diff(whole, torch.cat(parts))


def attention_decode_vs_prefill(ops: Ops, kv: KVCacheProbe, split: int | None, window: int | None = None) -> float:
    """Decoding a position (beside other sequences) against that position's row of one prefill."""
    ctx = kv.contexts[0]
    prefill = kv.run(ops, [(0, ctx, ctx)], split, window)[0]
    others = [(s, 1, kv.contexts[s]) for s in range(1, 4)]
    positions = (0, 1, 255, 256, 300, ctx - 1)
    decode = torch.cat([kv.run(ops, [(0, 1, p + 1)] + others, split, window)[0] for p in positions])
    return diff(prefill[list(positions)], decode)
