"""The `native` order: the framework's own kernels (MKL/FBGEMM/oneDNN on CPU, cuBLAS and SDPA on
CUDA), whose reduction order depends on the physical batch — measured, not assumed.

Matmuls in bf16 on a CPU without bf16 instructions (AVX2): ATen's bf16 GEMM is a slow reference
loop (2-8x slower than fp32 MKL, see docs/performance.md). Native runs them with FBGEMM's fp16 GEMM
on exactly-representable fp16 copies of the weights (fp32 products and accumulation, output
rounded once to the activation dtype), else as fp32 MKL GEMMs on fp32 copies; the values computed
are those of a bf16 GEMM with fp32 accumulation. `fast_cpu_matmuls=False` keeps ATen's bf16 kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.weights import LinearWeights


def native_linear(x: torch.Tensor, w: LinearWeights, fast_cpu_matmuls: bool = True) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T (+ bias) in the activation dtype, fp32 accumulation."""
    if x.dtype == torch.float32 or not fast_cpu_matmuls or x.device.type != "cpu":
        return F.linear(x, w.weight, w.bias)
    if w.pack is not None:
        # the 2**-shift goes on the input side, fused with the cast to fp32 (exact: a power of
        # two, and bf16 has fp32's exponent range), so the wider output needs no extra pass
        x32 = torch.empty(x.shape, dtype=torch.float32)
        torch.mul(x, w.pack.unscale, out=x32)
        return torch.ops.quantized.linear_dynamic_fp16(x32, w.pack.packed).to(x.dtype)
    if x.shape[0] == 1 or w.w32 is None:  # a GEMV is memory-bound: the bf16 kernel reads half the bytes
        return F.linear(x, w.weight, w.bias)
    if w.bias is None:
        return torch.mm(x.float(), w.w32.t()).to(x.dtype)
    return torch.addmm(w.bias.float(), x.float(), w.w32.t()).to(x.dtype)


def native_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Hugging Face computes it: statistics in fp32, normalised in fp32, then scaled (see
    `scale_normed`)."""
    return scale_normed(F.rms_norm(x.float(), (x.shape[-1],), eps=eps), weight, x.dtype)


def scale_normed(normed32: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The norm's epilogue, as each family rounds it: a weight in the model dtype scales the values rounded to
    it (Llama, Qwen, Mistral); a weight kept in fp32 scales the fp32 values before the one rounding (Gemma's
    1 + w, OLMo 2's w)."""
    if weight.dtype == torch.float32:
        return (normed32 * weight).to(dtype)
    return weight * normed32.to(dtype)


def native_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax over the last dimension (the vocabulary)."""
    return torch.log_softmax(logits.float(), dim=-1)


@dataclass(frozen=True)
class NativeAttentionMeta:
    """How the native kernels split one step's attention; built once, used by every layer."""

    decode_only: bool
    decode_rows: torch.Tensor | None  # packed rows of the decoding sequences (None: all or none)
    decode_slots: slice | torch.Tensor | None  # their KV slots: a slice when consecutive (a view)
    decode_context: int  # the longest context among them
    decode_bias: torch.Tensor | None  # [B, 1, 1, L] fp32: 0 on keys a row sees, -inf past its length
    prefills: tuple[tuple[int, int, int, int, torch.Tensor | None], ...]  # slot, rows lo:hi, context, mask

    @classmethod
    def build(cls, layout: AttentionLayout, device: torch.device) -> NativeAttentionMeta:
        prefills = []
        for i in layout.prefill:
            n, ctx = layout.query_len(i), layout.context_lens[i]
            # a whole prompt is plain causal; a later chunk also sees every earlier key; a window sees fewer
            plain = n == ctx and (layout.window is None or layout.window >= ctx)
            mask = None if plain else causal_mask(n, ctx, device, layout.window)
            prefills.append((layout.slots[i], layout.query_starts[i], layout.query_starts[i + 1], ctx, mask))
        decode_only = len(layout.decode) == layout.num_seqs
        rows = None
        if layout.decode and not decode_only:
            rows = torch.tensor([layout.query_starts[i] for i in layout.decode], device=device)
        slots = [layout.slots[i] for i in layout.decode]
        lens = [layout.context_lens[i] for i in layout.decode]
        longest = max(lens, default=0)
        slot_index: slice | torch.Tensor | None = None
        if slots:
            consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
            slot_index = slice(slots[0], slots[0] + len(slots)) if consecutive else torch.tensor(slots, device=device)
        mask = None
        firsts = [layout.first_key(n - 1) for n in lens]
        if lens and (min(lens) != longest or any(firsts)):
            keys = torch.arange(longest, device=device)[None, :]
            visible = (keys < torch.tensor(lens, device=device)[:, None]) & \
                (keys >= torch.tensor(firsts, device=device)[:, None])
            mask = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))[:, None, None, :]
        return cls(decode_only, rows, slot_index, longest, mask, tuple(prefills))


def causal_mask(n_query: int, n_ctx: int, device: torch.device, window: int | None = None) -> torch.Tensor:
    """Boolean [n_query, n_ctx] mask: the last n_query of n_ctx positions, each seeing itself and before (with a
    sliding `window`: itself and the window - 1 keys before it)."""
    q_pos = torch.arange(n_ctx - n_query, n_ctx, device=device)[:, None]
    keys = torch.arange(n_ctx, device=device)[None, :]
    visible = keys <= q_pos
    return visible if window is None else visible & (keys > q_pos - window)


def soft_cap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Attention-logit soft-capping (Gemma 2): cap * tanh(scores / cap), elementwise (no reduction)."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def native_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: NativeAttentionMeta,
                     scale: float, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of packed queries q [T, H, D] over the cache [slots, L, KVH, D]: every
    decoding sequence in one batched call; each prefill chunk through its own SDPA call, causal
    within the chunk and seeing all earlier keys (written out where the scores are soft-capped: SDPA cannot)."""
    if meta.decode_only:
        return _decode_attention(q, k_cache, v_cache, meta, scale, softcap)
    out = torch.empty_like(q)
    if meta.decode_rows is not None:
        out.index_copy_(0, meta.decode_rows, _decode_attention(q.index_select(0, meta.decode_rows),
                                                              k_cache, v_cache, meta, scale, softcap))
    for slot, lo, hi, ctx, mask in meta.prefills:
        k = k_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
        v = v_cache[slot, :ctx].transpose(0, 1).unsqueeze(0)
        qi = q[lo:hi].transpose(0, 1).unsqueeze(0)
        if softcap is None:
            o = F.scaled_dot_product_attention(
                qi, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
            )
        else:
            o = _capped_prefill(qi, k, v, mask if mask is not None else causal_mask(hi - lo, ctx, q.device), scale,
                                softcap)
        out[lo:hi] = o.squeeze(0).transpose(0, 1)
    return out


def _capped_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                    softcap: float) -> torch.Tensor:
    """q [1, H, n, D] over k, v [1, KVH, ctx, D]: fp32 scores, soft-capped, masked, softmax, P @ V."""
    group = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    scores = soft_cap(torch.matmul(q.float() * scale, k32.transpose(-1, -2)), softcap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v32).to(q.dtype)


def _decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: NativeAttentionMeta,
                      scale: float, softcap: float | None = None) -> torch.Tensor:
    """One query row per sequence, q [B, H, D]: scores, softmax and P @ V in fp32 over each
    sequence's cached keys, rounded once to the activation dtype.

    Written out rather than through SDPA: for a single query row, CPU SDPA's flash kernel costs
    3x more than these few batched matmuls at 16 sequences (see docs/performance.md)."""
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    longest = meta.decode_context
    # [B, KVH, L, D] fp32 copies of the keys and values (a gather when the slots are not consecutive)
    k = k_cache[meta.decode_slots, :longest].transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    v = v_cache[meta.decode_slots, :longest].transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    qg = (q.float() * scale).view(b, kv_heads, heads // kv_heads, head_dim)  # query heads grouped by KV head
    scores = soft_cap(torch.matmul(qg, k.transpose(-1, -2)), softcap)  # [B, KVH, group, L]
    if meta.decode_bias is not None:
        scores = scores + meta.decode_bias
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, KVH, group, D]
    return out.view(b, heads, head_dim).to(q.dtype)
