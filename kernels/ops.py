"""The one interface every reduction of the model goes through.

The engine never calls a matmul, a softmax or a norm directly: it calls an `Ops`. A kernel
policy (native, splitk, invariant) is a subclass, so a policy changes every reduction of a run
at once without touching the model.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class AttentionBatch:
    """Where each sequence's query rows sit in the packed [T, ...] batch, and what they attend to.

    Sequence i owns packed rows `query_starts[i]:query_starts[i+1]`, whose positions are
    `context_lens[i] - n_new .. context_lens[i] - 1`; its keys live in KV-cache slot `slots[i]`
    rows `0:context_lens[i]`, already written when attention runs.
    """

    slots: list[int]
    query_starts: list[int]
    context_lens: list[int]
    slots_t: torch.Tensor = field(repr=False)
    context_lens_t: torch.Tensor = field(repr=False)
    # Tensors derived from the fields above, built on first use and shared by every layer of the
    # step (an attention kernel runs once a layer on the same batch).
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def is_decode(self) -> bool:
        """Every sequence contributes exactly one query row (a pure decode step)."""
        return self.query_starts[-1] == len(self.slots)

    def query_len(self, i: int) -> int:
        return self.query_starts[i + 1] - self.query_starts[i]

    def cached(self, key: str, build: Any) -> Any:
        """`build()` once per batch under `key`; later calls (the next layers) reuse it."""
        if key not in self.derived:
            self.derived[key] = build()
        return self.derived[key]


_fp32_copies: dict[int, torch.Tensor] = {}


def fp32_copy(weight: torch.Tensor) -> torch.Tensor:
    """An fp32 contiguous copy of a weight, made on first use and freed with the weight.

    bf16 x bf16 products are exact in fp32, so an fp32 GEMM over the copies computes exactly
    what a bf16 GEMM with fp32 accumulation does (up to summation order), rounded once at the end.
    """
    if weight.dtype == torch.float32 and weight.is_contiguous():
        return weight
    key = id(weight)
    copy = _fp32_copies.get(key)
    if copy is None or copy.shape != weight.shape:
        copy = weight.detach().float().contiguous()
        _fp32_copies[key] = copy
        weakref.finalize(weight, _fp32_copies.pop, key, None)
    return copy


@dataclass(frozen=True)
class Fp16Packed:
    """A weight packed for FBGEMM's fp16 GEMM (fp16 storage, fp32 products and accumulation),
    scaled by 2**shift so that every value is an exact fp16 normal number."""

    packed: Any  # weight * 2**shift, and the bias as it is
    unscale: float  # 2**-shift: (x * 2**-shift) @ (w * 2**shift).T + b == x @ w.T + b, exactly


FP16_MIN_EXP, FP16_MAX_EXP = -14, 15  # binades of fp16's normal numbers
_fp16_packs: dict[int, Fp16Packed | None] = {}


def fp16_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Fp16Packed | None:
    """FBGEMM fp16 packing of a bf16/fp16 weight (and bias), or None where it would not be exact.

    A bf16 value has 8 significant bits and fp16 11, so a bf16 tensor whose nonzero magnitudes span
    at most 30 binades fits exactly in fp16 after one power-of-two scale; its products with bf16
    activations are then exact in fp32, and the result is what a bf16 GEMM with fp32 accumulation
    gives (up to summation order). Made once per (weight, bias); None also where FBGEMM is missing.
    """
    key = id(weight)
    if key in _fp16_packs:
        return _fp16_packs[key]
    pack: Fp16Packed | None = None
    w32 = weight.detach().float()
    magnitudes = w32.abs()
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.numel() and bool(torch.isfinite(nonzero).all()):
        top = int(torch.floor(torch.log2(nonzero.max())))
        bottom = int(torch.floor(torch.log2(nonzero.min())))
        shift = FP16_MIN_EXP - bottom
        if top + shift <= FP16_MAX_EXP:
            scaled = w32 * 2.0**shift
            if torch.equal(scaled.half().float(), scaled):
                b32 = None if bias is None else bias.detach().float()
                try:
                    pack = Fp16Packed(torch.ops.quantized.linear_prepack_fp16(scaled, b32), 2.0**-shift)
                except (RuntimeError, AttributeError, NotImplementedError):  # a build without FBGEMM
                    pack = None
    _fp16_packs[key] = pack
    weakref.finalize(weight, _fp16_packs.pop, key, None)
    return pack


class Ops:
    """Reductions of a transformer forward pass. This base class is the `native` policy:
    the framework's own kernels (MKL/FBGEMM/oneDNN on CPU, cuBLAS and SDPA on CUDA).

    Matmuls in bf16 on a CPU without bf16 instructions (AVX2): ATen's bf16 GEMM is a slow
    reference loop (2-8x slower than fp32 MKL, see docs/performance.md). Native runs them with
    torch's FBGEMM fp16 GEMM on exactly-representable fp16 copies of the weights (fp32 products
    and accumulation, output rounded once to the activation dtype), else as fp32 MKL GEMMs on
    fp32 copies; the values computed are those of a bf16 GEMM with fp32 accumulation.
    `fast_cpu_matmuls=False` keeps ATen's bf16 kernel instead (for comparison).
    """

    policy = "native"
    backend = "torch"

    def __init__(self, profile: str | None = None, fast_cpu_matmuls: bool = True) -> None:
        self.profile = profile
        self.fast_cpu_matmuls = fast_cpu_matmuls

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] @ weight[N, K].T (+ bias) in the activation dtype, fp32 accumulation."""
        if x.dtype == torch.float32 or not self.fast_cpu_matmuls or x.device.type != "cpu":
            return F.linear(x, weight, bias)
        pack = fp16_pack(weight, bias)
        if pack is not None:
            # the 2**-shift goes on the input side, fused with the cast to fp32 (exact: a power of
            # two, and bf16 has fp32's exponent range), so the wider output needs no extra pass
            x32 = torch.empty(x.shape, dtype=torch.float32)
            torch.mul(x, pack.unscale, out=x32)
            return torch.ops.quantized.linear_dynamic_fp16(x32, pack.packed).to(x.dtype)
        if x.shape[0] == 1:  # a GEMV is memory-bound: the bf16 kernel reads half the bytes of fp32
            return F.linear(x, weight, bias)
        if bias is None:
            return torch.mm(x.float(), fp32_copy(weight).t()).to(x.dtype)
        return torch.addmm(fp32_copy(bias), x.float(), fp32_copy(weight).t()).to(x.dtype)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm as Hugging Face computes it: statistics in fp32, normalised in fp32, rounded to
        the model dtype, then scaled by the weight in the model dtype."""
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
        return weight * normed.to(x.dtype)

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 log-softmax over the last dimension (the vocabulary)."""
        return torch.log_softmax(logits.float(), dim=-1)

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of packed queries q [T, H, D] over the cache [slots, L, KVH, D].

        Every single-row (decoding) sequence goes through one batched SDPA call; each multi-row
        (prefill) chunk through its own, causal within the chunk and seeing all earlier keys."""
        plan = batch.cached("native_plan", lambda: _AttentionPlan.build(batch, q.device))
        if plan.decode_only:
            return _decode_attention(q, k_cache, v_cache, plan, scale)
        out = torch.empty_like(q)
        if plan.decode_rows is not None:
            out.index_copy_(0, plan.decode_rows, _decode_attention(q.index_select(0, plan.decode_rows),
                                                              k_cache, v_cache, plan, scale))
        for slot, lo, hi, ctx, mask in plan.prefills:
            k = k_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
            v = v_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
            qi = q[lo:hi].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qi, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
            )
            out[lo:hi] = o.squeeze(0).transpose(0, 1)
        return out


@dataclass
class _AttentionPlan:
    """How the native kernel splits one step's attention; built once, used by every layer."""

    decode_only: bool
    decode_rows: torch.Tensor | None  # packed rows of the decoding sequences (None: all or none)
    decode_slots: slice | torch.Tensor | None  # their KV slots: a slice when consecutive (a view, no gather)
    decode_context: int  # the longest context among them
    decode_bias: torch.Tensor | None  # [B, 1, 1, L] fp32: 0 on keys a row sees, -inf past its length;
    # None when every decoding sequence has the same length
    prefills: list[tuple[int, int, int, int, torch.Tensor | None]]  # slot, rows lo:hi, context, mask

    @classmethod
    def build(cls, batch: AttentionBatch, device: torch.device) -> _AttentionPlan:
        decode = [i for i in range(batch.num_seqs) if batch.query_len(i) == 1]
        prefills = []
        for i in range(batch.num_seqs):
            n = batch.query_len(i)
            if n > 1:
                ctx = batch.context_lens[i]
                # a whole prompt is plain causal; a later chunk also sees every earlier key
                mask = None if n == ctx else causal_mask(n, ctx, device)
                prefills.append((batch.slots[i], batch.query_starts[i], batch.query_starts[i + 1], ctx, mask))
        decode_only = len(decode) == batch.num_seqs
        rows = None
        if decode and not decode_only:
            rows = torch.tensor([batch.query_starts[i] for i in decode], device=device)
        slots = [batch.slots[i] for i in decode]
        lens = [batch.context_lens[i] for i in decode]
        longest = max(lens, default=0)
        slot_index: slice | torch.Tensor | None = None
        if slots:
            consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
            slot_index = slice(slots[0], slots[0] + len(slots)) if consecutive else torch.tensor(slots, device=device)
        mask = None
        if lens and min(lens) != longest:
            lens_t = torch.tensor(lens, device=device)
            visible = torch.arange(longest, device=device)[None, :] < lens_t[:, None]
            mask = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))[:, None, None, :]
        return cls(decode_only, rows, slot_index, longest, mask, prefills)


def causal_mask(n_query: int, n_ctx: int, device: torch.device) -> torch.Tensor:
    """Boolean [n_query, n_ctx] mask: the last n_query of n_ctx positions, each seeing itself and before."""
    q_pos = torch.arange(n_ctx - n_query, n_ctx, device=device)[:, None]
    return torch.arange(n_ctx, device=device)[None, :] <= q_pos


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: _AttentionPlan,
                      scale: float) -> torch.Tensor:
    """One query row per sequence, q [B, H, D]: scores, softmax and P @ V in fp32 over each
    sequence's cached keys, rounded once to the activation dtype.

    Written out rather than through SDPA: for a single query row, CPU SDPA's flash kernel costs
    3x more than these few batched matmuls at 16 sequences (see docs/performance.md)."""
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    longest = plan.decode_context
    # [B, KVH, L, D] fp32 copies of the keys and values (a gather when the slots are not consecutive)
    k = k_cache[plan.decode_slots, :longest].transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    v = v_cache[plan.decode_slots, :longest].transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    qg = (q.float() * scale).view(b, kv_heads, heads // kv_heads, head_dim)  # query heads grouped by KV head
    scores = torch.matmul(qg, k.transpose(-1, -2))  # [B, KVH, group, L]
    if plan.decode_bias is not None:
        scores = scores + plan.decode_bias
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, KVH, group, D]
    return out.view(b, heads, head_dim).to(q.dtype)
