"""The fast fixed-order primitives of the invariant torch twin, probed directly.

FBGEMM's fp16 GEMM is row-invariant only when no real row lands in its 1- or 2-row micro-kernel
(flakecheck/kernels/torch_twins.py has the measurements); these tests hold the padding rule to that for
every M in 1..512 and any row position on SmolLM2's shapes, with weights that take the FBGEMM
path (tests/test_kernels_twins.py's random lm_head may fall back to fp32), and check that
attention computed by 64-key blocks does not depend on how far the batch's longest context
reaches (more blocks, more splits, a mask or none)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.torch_twins import fbgemm_fixed_order_linear, fbgemm_rows
from flakecheck.kernels.weights import fp16_pack
from tests import machine_paths

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 9, 3, 64, 49152
SHAPES = {"qkv": (HIDDEN, 960), "o_proj": (HIDDEN, HIDDEN), "gate_up": (HIDDEN, 2 * INTER),
          "down": (INTER, HIDDEN), "lm_head": (HIDDEN, VOCAB)}
MAX_ROWS = 512
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
invariant = machine_paths.ops("invariant")

needs_fbgemm = pytest.mark.skipif(machine_paths.paths("invariant").fbgemm != "padded",
                                  reason="the self-check rejected FBGEMM's padded fp16 GEMM on this machine "
                                  "(the fp32 path runs instead)")


def _rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _packable(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A random weight whose magnitudes span < 30 binades, so it is exact in scaled fp16 (as
    SmolLM2's real weights all are) and takes the FBGEMM path."""
    w = _rand(n, k, dtype=torch.float32, seed=seed, scale=k**-0.5)
    floor = 2.0**-24
    return torch.where(w.abs() < floor, torch.full_like(w, floor), w).to(dtype)


def test_fbgemm_rows_rule() -> None:
    for m in range(1, 2 * MAX_ROWS):
        padded = fbgemm_rows(m)
        assert m <= padded <= m + 2 and padded % 6 in (0, 3, 4, 5)
    assert [fbgemm_rows(m) for m in (1, 2, 3, 7, 8, 16, 64)] == [3, 3, 3, 9, 9, 16, 64]


@pytest.fixture(scope="module", params=[(name, dtype) for name in SHAPES for dtype in (torch.bfloat16, torch.float16)],
                ids=lambda p: f"{p[0]}-{str(p[1]).split('.')[-1]}")
def projection(request):
    """A packable weight of one projection, a bias, MAX_ROWS input rows, and their outputs at M=MAX_ROWS."""
    name, dtype = request.param
    k, n = SHAPES[name]
    w = _packable(n, k, dtype, seed=21)
    b = _rand(n, dtype=dtype, seed=22)
    x = _rand(MAX_ROWS, k, dtype=dtype, seed=23)
    assert fp16_pack(w, b) is not None
    return w, b, x, invariant.linear(x, w, b)


@needs_fbgemm
@SETTINGS
@given(m=st.integers(1, MAX_ROWS), offset=st.integers(0, MAX_ROWS - 1))
@example(m=1, offset=0)
@example(m=2, offset=5)
@example(m=7, offset=0)
@example(m=14, offset=3)
@example(m=31, offset=0)
@example(m=127, offset=1)
@example(m=511, offset=0)
def test_fbgemm_linear_rows_do_not_depend_on_m_or_position(projection, m: int, offset: int) -> None:
    w, b, x, reference = projection
    rows = (torch.arange(m) + offset) % MAX_ROWS  # any rows, at any position of the batch
    fast = fbgemm_fixed_order_linear(x[rows], fp16_pack(w, b))
    assert torch.equal(fast, reference[rows])
    assert torch.equal(invariant.linear(x[rows], w, b), reference[rows])


@needs_fbgemm
@pytest.mark.parametrize("threads", [1, 2])
def test_fbgemm_linear_every_m_and_thread_count(threads: int) -> None:
    """Every M in 1..MAX_ROWS, not a sample: the rule is a property of FBGEMM's kernel table."""
    k, n = SHAPES["qkv"]
    w, x = _packable(n, k, torch.bfloat16, seed=24), _rand(MAX_ROWS, k, dtype=torch.bfloat16, seed=25)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reference = invariant.linear(x, w)
        bad = [m for m in range(1, MAX_ROWS + 1) if not torch.equal(invariant.linear(x[-m:], w), reference[-m:])]
    finally:
        torch.set_num_threads(before)
    assert bad == []


def test_fbgemm_linear_matches_float64() -> None:
    x = _rand(5, HIDDEN, dtype=torch.bfloat16, seed=26)
    w, b = _packable(VOCAB, HIDDEN, torch.bfloat16, seed=27), _rand(VOCAB, dtype=torch.bfloat16, seed=28)
    got = invariant.linear(x, w, b)
    ref = x.double() @ w.double().T + b.double()
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert float((got.double() - ref).abs().max() / ref.abs().max()) <= 1e-2


# ---------------------------------------------------------------------------------------------
# attention by 64-key blocks

SLOTS, LENGTH = 6, 800


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def kv(request):
    dtype = request.param
    k = _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM, dtype=dtype, seed=31)
    v = _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM, dtype=dtype, seed=32)
    q = _rand(SLOTS, LENGTH, HEADS, HEAD_DIM, dtype=dtype, seed=33)
    return q, k, v


def _attend(kv, seqs: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    q_all, k, v = kv
    q = torch.cat([q_all[s, c - n : c] for s, n, c in seqs])
    batch = AttentionLayout.of(seqs)
    out = invariant.attention(q, k, v, batch, HEAD_DIM**-0.5)
    return [out[batch.query_starts[i] : batch.query_starts[i + 1]] for i in range(len(seqs))]


@SETTINGS
@given(ctx=st.integers(1, LENGTH), n=st.integers(1, 9), longer=st.integers(1, LENGTH))
@example(ctx=128, n=1, longer=700)  # one split, no mask alone; three splits, masked together
@example(ctx=64, n=1, longer=65)  # a whole block alone; a second, masked block together
@example(ctx=256, n=3, longer=257)  # a whole split alone; a second split together
def test_rows_do_not_depend_on_the_longest_context(kv, ctx: int, n: int, longer: int) -> None:
    """A sequence's rows equal themselves computed next to a decoding sequence of any length
    (which changes how many blocks and splits are computed, and whether a mask is needed)."""
    probe = (0, min(n, ctx), ctx)
    alone = _attend(kv, [probe])[0]
    assert torch.equal(_attend(kv, [probe, (1, 1, longer)])[0], alone)
    assert torch.equal(_attend(kv, [(2, 1, longer), probe, (3, 1, max(1, longer // 2))])[1], alone)


# ---------------------------------------------------------------------------------------------
# RMSNorm through ATen's fused kernel: hidden rows and per-head rows (Qwen3's q/k norm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@SETTINGS
@given(m=st.integers(1, MAX_ROWS), offset=st.integers(0, MAX_ROWS - 1))
@example(m=1, offset=0)
def test_rmsnorm_rows_do_not_depend_on_m_or_position(dtype: torch.dtype, m: int, offset: int) -> None:
    rows = (torch.arange(m) + offset) % MAX_ROWS
    for shape in ((MAX_ROWS, HIDDEN), (MAX_ROWS, HEADS, HEAD_DIM)):
        x = _rand(*shape, dtype=dtype, seed=41, scale=3.0)
        w = _rand(shape[-1], dtype=dtype, seed=42, scale=0.1) + 1
        assert torch.equal(invariant.rmsnorm(x[rows], w, 1e-6), invariant.rmsnorm(x, w, 1e-6)[rows])
