"""The Triton kernels: accuracy against float64 with NaN-poisoned outputs, agreement with the torch
twins, and the invariance properties, on small shapes.

Runs natively on CUDA; on CPU only under TRITON_INTERPRET=1, which must be set before the kernels
are decorated — tests/test_kernels_triton_interpreted.py runs this file in a subprocess so no
other test in the main pytest process sees the interpreter."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not (INTERPRETED or torch.cuda.is_available()),
                                reason="needs CUDA or TRITON_INTERPRET=1 (see test_kernels_triton_interpreted.py)")
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu")
# The interpreter casts fp32 -> bf16 by truncation, not round-to-nearest (measured: max error
# 2 bf16 ulps where torch gives 1), so interpreted bf16 outputs get twice the bound.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2 if INTERPRETED else 1e-2}
DTYPES = (torch.float32, torch.bfloat16)


def _rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    x = torch.where(x.abs() < 1e-3 * scale, torch.full_like(x, 1e-3 * scale), x)  # never zero
    return x.to(dtype=dtype, device=DEVICE)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(got).all(), "NaN/inf left in the output: an element was not written"
    ref = ref.to(got.device)
    return float((got.double() - ref).abs().max() / ref.abs().max())


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@pytest.fixture(scope="module")
def tk():
    from flakecheck.kernels import triton_kernels

    return triton_kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,k,n", [(1, 64, 64), (5, 100, 77), (32, 128, 1024), (17, 96, 130)])
def test_matmuls_match_float64(tk, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    x, w = _rand(m, k, dtype=dtype, seed=1), _rand(n, k, dtype=dtype, seed=2, scale=k**-0.5)
    b = _rand(n, dtype=dtype, seed=3)
    ref = x.double() @ w.double().T + b.double()
    got = tk.matmul_persistent(x, w, b, out=_poisoned((m, n), dtype))
    assert _rel_err(got, ref) <= TOLERANCE[dtype]
    for splits in (1, 3):
        got = tk.matmul_splitk(x, w, splits, b, out=_poisoned((m, n), dtype))
        assert _rel_err(got, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_persistent_matmul_rows_do_not_depend_on_m(tk, dtype: torch.dtype) -> None:
    x, w = _rand(40, 96, dtype=dtype, seed=4), _rand(48, 96, dtype=dtype, seed=5)
    whole = tk.matmul_persistent(x, w)
    for m in (1, 3, 17, 33):  # other tile heights (16, 64) and other row positions
        assert torch.equal(tk.matmul_persistent(x[:m], w), whole[:m])
        assert torch.equal(tk.matmul_persistent(x[40 - m :], w), whole[40 - m :])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_row_kernels_match_float64_and_are_row_invariant(tk, dtype: torch.dtype) -> None:
    x, w = _rand(6, 96, dtype=dtype, seed=6), _rand(96, dtype=dtype, seed=7, scale=0.1) + 1
    xd = x.double()
    # Hugging Face semantics: the normalised row is rounded to the model dtype before the scale
    ref = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype).double() * w.double()
    got = tk.rmsnorm(x, w, 1e-5, out=_poisoned(x.shape, dtype))
    assert _rel_err(got, ref) <= TOLERANCE[dtype]
    assert torch.equal(tk.rmsnorm(x[2:3], w, 1e-5), got[2:3])
    logits = _rand(5, 3000, dtype=dtype, seed=8, scale=4.0)
    got = tk.log_softmax(logits, out=_poisoned(logits.shape, torch.float32))
    assert _rel_err(got, torch.log_softmax(logits.double(), -1)) <= 1e-5
    assert torch.equal(tk.log_softmax(logits[4:]), got[4:])


def _attention_inputs(dtype: torch.dtype):
    slots, length, kvh, heads, d = 4, 80, 2, 4, 16
    k = _rand(slots, length, kvh, d, dtype=dtype, seed=9)
    v = _rand(slots, length, kvh, d, dtype=dtype, seed=10)
    q = _rand(slots, length, heads, d, dtype=dtype, seed=11)
    return q, k, v


def _run(backend: str, qkv, seqs, split_size: int = 32, window: int | None = None, softcap: float | None = None):
    """Attention of `seqs` with `split_size` keys a split (several splits on a small cache)."""
    from flakecheck.kernels import AttentionLayout, get_ops
    from flakecheck.kernels.policy import parse_policy

    q_all, k, v = qkv
    q = torch.cat([q_all[s, c - n : c] for s, n, c in seqs])
    layout = AttentionLayout.of(seqs, [split_size] * len(seqs), window)
    out = get_ops(parse_policy("invariant"), backend).attention(q, k, v, layout, 0.25, softcap)
    return [out[layout.query_starts[i] : layout.query_starts[i + 1]] for i in range(len(seqs))]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_attention_agrees_with_torch_twin_and_float64(dtype: torch.dtype) -> None:
    qkv = _attention_inputs(dtype)
    seqs = [(0, 1, 70), (1, 5, 40), (2, 1, 3)]
    tri = _run("triton", qkv, seqs)
    twin = _run("torch", tuple(t.cpu() for t in qkv), seqs)
    q_all, k, v = qkv
    for (slot, n, ctx), a, b in zip(seqs, tri, twin):
        qd = q_all[slot, ctx - n : ctx].double().transpose(0, 1)
        kd = k[slot, :ctx].double().repeat_interleave(2, dim=1).transpose(0, 1)
        vd = v[slot, :ctx].double().repeat_interleave(2, dim=1).transpose(0, 1)
        mask = torch.arange(ctx, device=DEVICE)[None, :] <= torch.arange(ctx - n, ctx, device=DEVICE)[:, None]
        scores = (qd @ kd.transpose(-1, -2) * 0.25).masked_fill(~mask, float("-inf"))
        ref = (torch.softmax(scores, -1) @ vd).transpose(0, 1)
        assert _rel_err(a, ref) <= TOLERANCE[dtype]
        assert _rel_err(a, b.double()) <= TOLERANCE[dtype]
    # invariance: the first sequence alone, and its decode row against its prefill row
    assert torch.equal(_run("triton", qkv, [seqs[0]])[0], tri[0])
    prefill = _run("triton", qkv, [(0, 70, 70)])[0]
    assert torch.equal(prefill[-1:], tri[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_windowed_capped_attention_agrees_with_torch_twin_and_float64(dtype: torch.dtype) -> None:
    """A sliding window of 20 keys (whole splits of 32 before it skipped, one cut in two) and Gemma 2's soft cap."""
    window, cap = 20, 1.5
    qkv = _attention_inputs(dtype)
    seqs = [(0, 1, 70), (1, 5, 40), (2, 1, 3), (3, 9, 66)]
    tri = _run("triton", qkv, seqs, window=window, softcap=cap)
    twin = _run("torch", tuple(t.cpu() for t in qkv), seqs, window=window, softcap=cap)
    q_all, k, v = qkv
    for (slot, n, ctx), a, b in zip(seqs, tri, twin):
        qd = q_all[slot, ctx - n : ctx].double().transpose(0, 1)
        kd = k[slot, :ctx].double().repeat_interleave(2, dim=1).transpose(0, 1)
        vd = v[slot, :ctx].double().repeat_interleave(2, dim=1).transpose(0, 1)
        keys, positions = torch.arange(ctx, device=DEVICE)[None, :], torch.arange(ctx - n, ctx, device=DEVICE)[:, None]
        mask = (keys <= positions) & (keys > positions - window)
        scores = torch.tanh(qd @ kd.transpose(-1, -2) * 0.25 / cap) * cap
        ref = (torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vd).transpose(0, 1)
        assert _rel_err(a, ref) <= TOLERANCE[dtype]
        assert _rel_err(a, b.double()) <= TOLERANCE[dtype]
    assert torch.equal(_run("triton", qkv, [seqs[0]], window=window, softcap=cap)[0], tri[0])
    prefill = _run("triton", qkv, [(0, 70, 70)], window=window, softcap=cap)[0]
    assert torch.equal(prefill[-1:], tri[0])


def test_linear_agrees_with_torch_twin(tk) -> None:
    from flakecheck.kernels import get_ops
    from flakecheck.kernels.policy import parse_policy

    x, w = _rand(9, 128, dtype=torch.float32, seed=12), _rand(64, 128, dtype=torch.float32, seed=13)
    twin = get_ops(parse_policy("invariant"), "torch").linear(x.cpu(), w.cpu())
    assert _rel_err(tk.matmul_persistent(x, w), twin.double()) <= 1e-5
