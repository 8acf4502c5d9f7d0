"""Properties of the torch twins on SmolLM2-135M's real shapes (random weights of those shapes).

invariant: per-row bitwise equality whatever the batch; splitk: the negative control (varies
across batch sizes, repeats exactly); both: accuracy against a float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.policy import matmul_order
from tests import machine_paths

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 9, 3, 64, 49152
# (K, N) of every projection of the model
SHAPES = {"qkv": (HIDDEN, 960), "o_proj": (HIDDEN, HIDDEN), "gate_up": (HIDDEN, 2 * INTER),
          "down": (INTER, HIDDEN), "lm_head": (HIDDEN, VOCAB)}
DTYPES = (torch.bfloat16, torch.float32)
MAX_ROWS = 512
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
invariant = machine_paths.ops("invariant")
splitk = machine_paths.ops("splitk")


def _rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.fixture(scope="module", params=[(name, dtype) for name in SHAPES for dtype in DTYPES],
                ids=lambda p: f"{p[0]}-{str(p[1]).split('.')[-1]}")
def projection(request):
    """Weights of one projection, MAX_ROWS input rows, and their invariant outputs computed at M=MAX_ROWS."""
    name, dtype = request.param
    k, n = SHAPES[name]
    w = _rand(n, k, dtype=dtype, seed=1, scale=k**-0.5)
    x = _rand(MAX_ROWS, k, dtype=dtype, seed=2)
    return w, x, invariant.linear(x, w)


@SETTINGS
@given(m=st.integers(1, MAX_ROWS), offset=st.integers(0, MAX_ROWS - 1))
@example(m=1, offset=0)
@example(m=3, offset=7)
@example(m=5, offset=100)
def test_invariant_linear_rows_do_not_depend_on_m_or_position(projection, m: int, offset: int) -> None:
    w, x, reference = projection
    rows = (torch.arange(m) + offset) % MAX_ROWS  # any rows, at any position of the batch
    assert torch.equal(invariant.linear(x[rows], w), reference[rows])


@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(m=st.integers(1, MAX_ROWS), offset=st.integers(0, MAX_ROWS - 1))
@example(m=1, offset=0)
def test_invariant_row_ops_do_not_depend_on_m(dtype: torch.dtype, m: int, offset: int) -> None:
    rows = (torch.arange(m) + offset) % MAX_ROWS
    x = _rand(MAX_ROWS, HIDDEN, dtype=dtype, seed=3)
    w = _rand(HIDDEN, dtype=dtype, seed=4, scale=0.1) + 1
    assert torch.equal(invariant.rmsnorm(x[rows], w, 1e-5), invariant.rmsnorm(x, w, 1e-5)[rows])
    logits = _rand(MAX_ROWS, VOCAB, dtype=dtype, seed=5, scale=4.0)
    assert torch.equal(invariant.log_softmax(logits[rows]), invariant.log_softmax(logits)[rows])


# ---------------------------------------------------------------------------------------------
# attention over a KV cache of SmolLM2's geometry

SLOTS, LENGTH = 12, 700


@pytest.fixture(scope="module", params=DTYPES, ids=["bf16", "fp32"])
def kv(request):
    dtype = request.param
    k = _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM, dtype=dtype, seed=6)
    v = _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM, dtype=dtype, seed=7)
    q = _rand(SLOTS, LENGTH, HEADS, HEAD_DIM, dtype=dtype, seed=8)  # the query of slot s at position p
    return q, k, v


def _attend(ops, kv, seqs: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    q_all, k, v = kv
    q = torch.cat([q_all[s, c - n : c] for s, n, c in seqs])
    batch = AttentionLayout.of(seqs)
    out = ops.attention(q, k, v, batch, HEAD_DIM**-0.5)
    return [out[batch.query_starts[i] : batch.query_starts[i + 1]] for i in range(len(seqs))]


@SETTINGS
@given(ctx=st.integers(1, LENGTH), others=st.lists(st.tuples(st.integers(1, 40), st.integers(40, LENGTH)),
                                                   max_size=6), where=st.integers(0, 6))
def test_invariant_attention_rows_do_not_depend_on_the_batch(kv, ctx: int, others, where: int) -> None:
    """A prefill chunk's rows (or a decode row) equal the same rows computed alone, whatever other
    sequences (decoding or prefilling) share the batch and wherever it sits in it."""
    n = max(1, ctx % 37)
    probe = (0, n, ctx)
    seqs = [(slot + 1, min(rows, c), c) for slot, (rows, c) in enumerate(others)]
    seqs.insert(min(where, len(seqs)), probe)
    together = _attend(invariant, kv, seqs)[seqs.index(probe)]
    assert torch.equal(together, _attend(invariant, kv, [probe])[0])


@SETTINGS
@given(ctx=st.integers(2, LENGTH), chunk=st.integers(1, 300), cached=st.integers(0, 3))
def test_invariant_attention_chunked_prefill_and_prefix_cache_equal_one_prefill(kv, ctx: int, chunk: int,
                                                                                cached: int) -> None:
    """Prefill in chunks, starting after a prefix-cache hit of `cached` 16-token blocks, equals one
    prefill; decoding the last position equals its prefill row."""
    whole = _attend(invariant, kv, [(0, ctx, ctx)])[0]
    start = min(ctx - 1, 16 * cached)
    parts = []
    for lo in range(start, ctx, chunk):
        hi = min(ctx, lo + chunk)
        parts.append(_attend(invariant, kv, [(0, hi - lo, hi)])[0])
    assert torch.equal(torch.cat(parts), whole[start:])
    assert torch.equal(_attend(invariant, kv, [(0, 1, ctx), (3, 1, 50)])[0], whole[-1:])


# ---------------------------------------------------------------------------------------------
# splitk: the negative control


def test_splitk_linear_changes_rows_exactly_where_the_batch_changes_the_split_count() -> None:
    """Decode alone (M=1) vs in batches of 8: a projection whose split count differs between the two
    gives other bits for some rows; one whose split count is the same gives the same bits for every
    row (the primitive itself is row-invariant: only the plan moves a row)."""
    varied, same_plan = [], []
    for name, (k, n) in SHAPES.items():
        w = _rand(n, k, dtype=torch.bfloat16, seed=9, scale=k**-0.5)
        x = _rand(64, k, dtype=torch.bfloat16, seed=10)
        batched = torch.cat([splitk.linear(x[i : i + 8], w) for i in range(0, 64, 8)])
        assert torch.equal(batched, torch.cat([splitk.linear(x[i : i + 8], w) for i in range(0, 64, 8)]))
        alone = torch.cat([splitk.linear(x[i : i + 1], w) for i in range(64)])
        if matmul_order(splitk.policy, 1, n, k, 132) == matmul_order(splitk.policy, 8, n, k, 132):
            same_plan.append(name)
            assert torch.equal(alone, batched), name
        elif not torch.equal(alone, batched):
            varied.append(name)
    # rounding to bf16 hides most fp32 differences (~1e-4 of outputs), so not every changed plan shows
    assert same_plan and len(varied) >= 2, f"varied on {varied}; same split count on {same_plan}"


def test_splitk_attention_varies_with_batch_composition_and_repeats_exactly(kv) -> None:
    seqs = [(s, 1, 100 + 45 * s) for s in range(SLOTS)]
    together = torch.cat(_attend(splitk, kv, seqs))
    assert torch.equal(together, torch.cat(_attend(splitk, kv, seqs)))
    alone = torch.cat([_attend(splitk, kv, [seq])[0] for seq in seqs])
    assert not torch.equal(alone.float(), together.float())


# ---------------------------------------------------------------------------------------------
# accuracy against float64, on fresh non-zero inputs, with the allocator poisoned first

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _poison_allocator(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Free a NaN block of the output's size so an output allocated next (glibc reuses the block)
    starts as NaN: an element the kernel forgets to write then fails the NaN check."""
    block = torch.full(shape, float("nan"), dtype=dtype)
    del block


def _nonzero(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    x = _rand(*shape, dtype=torch.float32, seed=seed, scale=scale)
    return torch.where(x.abs() < 1e-3 * scale, torch.full_like(x, 1e-3 * scale), x).to(dtype)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(got).all(), "NaN or inf in the output (an unwritten element?)"
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("ops", [invariant, splitk], ids=["invariant", "splitk"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("m,k,n", [(1, 576, 960), (7, 1536, 576), (32, 128, 1024), (33, 100, 77), (5, 576, 49152)])
def test_linear_matches_float64(ops, dtype: torch.dtype, m: int, k: int, n: int) -> None:
    x, w = _nonzero(m, k, dtype=dtype, seed=m + k), _nonzero(n, k, dtype=dtype, seed=n, scale=k**-0.5)
    b = _nonzero(n, dtype=dtype, seed=3)
    _poison_allocator((m, n), dtype)
    got = ops.linear(x, w, b)
    ref = x.double() @ w.double().T + b.double()
    assert got.shape == (m, n) and got.dtype == dtype
    assert _rel_err(got, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("ops", [invariant, splitk], ids=["invariant", "splitk"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
def test_row_ops_match_float64(ops, dtype: torch.dtype) -> None:
    x = _nonzero(9, HIDDEN, dtype=dtype, seed=11)
    w = _nonzero(HIDDEN, dtype=dtype, seed=12, scale=0.1) + 1
    xd = x.double()
    # Hugging Face semantics: the normalised row is rounded to the model dtype before the scale
    ref = (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype).double() * w.double()
    assert _rel_err(ops.rmsnorm(x, w, 1e-5), ref) <= TOLERANCE[dtype]
    logits = _nonzero(3, VOCAB, dtype=dtype, seed=13, scale=4.0)
    got = ops.log_softmax(logits)
    assert got.dtype == torch.float32
    assert _rel_err(got, torch.log_softmax(logits.double(), -1)) <= 1e-5  # fp32 whatever the input dtype


@pytest.mark.parametrize("ops", [invariant, splitk], ids=["invariant", "splitk"])
def test_attention_matches_float64(ops, kv) -> None:
    q_all, k, v = kv
    seqs = [(0, 1, 600), (1, 40, 300), (2, 1, 3), (3, 1, 257)]
    _poison_allocator((sum(n for _, n, _ in seqs), HEADS, HEAD_DIM), q_all.dtype)
    outs = _attend(ops, kv, seqs)
    group = HEADS // KV_HEADS
    for (slot, n, ctx), got in zip(seqs, outs):
        qd = q_all[slot, ctx - n : ctx].double().transpose(0, 1)  # [H, n, D]
        kd = k[slot, :ctx].double().repeat_interleave(group, dim=1).transpose(0, 1)
        vd = v[slot, :ctx].double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qd @ kd.transpose(-1, -2) * HEAD_DIM**-0.5
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - n, ctx)[:, None]
        ref = (torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vd).transpose(0, 1)
        assert _rel_err(got, ref) <= TOLERANCE[q_all.dtype]
