"""Row-invariant primitives: a row gives the same bits alone as inside a batch of 2..300 mixed rows,
each row under its own plan. This is what makes simulated replay bitwise equal to physical replay:
every physical forward pass holds rows of many steps, each reduced in its own step's order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flakecheck.kernels import AttentionLayout
from flakecheck.kernels.layout import group_rows
from flakecheck.kernels.plan import FIXED
from flakecheck.kernels.profiles import split_bounds
from flakecheck.kernels.torch_twins import ROW_BLOCK, pad_rows, split_k_matmul
from tests import machine_paths

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HIDDEN, INTER, VOCAB = 576, 1536, 4096
ops = machine_paths.ops("splitk", "invariant")  # the backend runs whatever order a group asks for
gen = torch.Generator().manual_seed(0)


def _rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


WEIGHTS = {name: ops.executor.prepare_linear(_rand(n, k, scale=k**-0.5), _rand(n) if name == "qkv" else None,
                                             {"splitk", "invariant"})
           for name, (n, k) in {"qkv": (960, HIDDEN), "down": (HIDDEN, INTER)}.items()}
X = {"qkv": _rand(300, HIDDEN), "down": _rand(300, INTER)}
NORM_W, HIDDEN_X, LOGITS = _rand(HIDDEN, scale=0.1) + 1, _rand(300, HIDDEN), _rand(300, VOCAB, scale=4.0)


def mixed_batch(draw_rows: list[int], draw_orders: list[int]) -> tuple[list[int], list[int], tuple]:
    """Row indices (with repeats, any order) cut into runs, each run under one order, as the runs of a
    physical batch's steps are; and the groups an op gets for them."""
    spans, start, orders = [], 0, []
    per_run = max(1, len(draw_rows) // len(draw_orders))
    for i, order in enumerate(draw_orders):
        last = i == len(draw_orders) - 1
        n = len(draw_rows) - start if last else min(per_run, len(draw_rows) - start)
        if n <= 0:
            break
        spans.append((order, start, start + n))
        orders += [order] * n
        start += n
    return draw_rows[:start], orders, group_rows(spans, start)


rows_st = st.lists(st.integers(0, 299), min_size=2, max_size=300)
split_orders = st.lists(st.sampled_from([FIXED, 1, 2, 3, 5, 9]), min_size=1, max_size=6)


@SETTINGS
@given(rows=rows_st, orders=split_orders, name=st.sampled_from(sorted(WEIGHTS)))
def test_matmul_rows_alone_equal_rows_in_a_mixed_batch(rows: list[int], orders: list[int], name: str) -> None:
    rows, row_orders, groups = mixed_batch(rows, orders)
    x, w = X[name], WEIGHTS[name]
    together = ops.linear(x[rows], w, groups=groups)
    for i, (row, order) in enumerate(zip(rows, row_orders)):
        assert torch.equal(together[i], ops.executor.linear(x[row : row + 1], w, order)[0]), (row, order)


def split_k_by_definition(x32: torch.Tensor, w32: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """One 2-D GEMM per K range on rows padded to ROW_BLOCK, partials added in split order."""
    xp = pad_rows(x32, ROW_BLOCK)
    partials = [F.linear(xp[:, lo:hi], w32[:, lo:hi]) for lo, hi in bounds]
    total = partials[0]
    for partial in partials[1:]:
        total = total + partial
    return total[: x32.shape[0]]


@pytest.mark.parametrize("n,k", [(960, HIDDEN), (HIDDEN, HIDDEN), (3072, HIDDEN), (HIDDEN, INTER)])
def test_split_k_runs_each_range_as_its_own_gemm_would(n: int, k: int) -> None:
    """The batched partial GEMMs give the bits of one GEMM per K range, for every split count and row count."""
    w32 = _rand(n, k, scale=k**-0.5).float()
    for m in (1, 3, 8, 13, 64, 300):
        x32 = _rand(m, k).float()
        for splits in range(1, 17):
            bounds = split_bounds(k, splits)
            assert torch.equal(split_k_matmul(x32, w32, bounds), split_k_by_definition(x32, w32, bounds)), (m, splits)


@SETTINGS
@given(rows=rows_st, orders=st.lists(st.sampled_from([FIXED, 1, 2, 4]), min_size=1, max_size=4))
def test_norm_and_log_softmax_rows_alone_equal_rows_in_a_mixed_batch(rows: list[int], orders: list[int]) -> None:
    rows, row_orders, groups = mixed_batch(rows, orders)
    normed = ops.rmsnorm(HIDDEN_X[rows], NORM_W, 1e-5, groups)
    logprobs = ops.log_softmax(LOGITS[rows], groups)
    for i, (row, order) in enumerate(zip(rows, row_orders)):
        assert torch.equal(normed[i], ops.executor.rmsnorm(HIDDEN_X[row : row + 1], NORM_W, 1e-5, order)[0])
        assert torch.equal(logprobs[i], ops.executor.log_softmax(LOGITS[row : row + 1], order)[0])


SLOTS, LENGTH, HEADS, KV_HEADS, HEAD_DIM = 24, 700, 9, 3, 64
K_CACHE, V_CACHE = _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM), _rand(SLOTS, LENGTH, KV_HEADS, HEAD_DIM)
Q = _rand(SLOTS, LENGTH, HEADS, HEAD_DIM)


def _attend(seqs: list[tuple[int, int, int]], splits: list[int]) -> list[torch.Tensor]:
    q = torch.cat([Q[s, c - n : c] for s, n, c in seqs])
    layout = AttentionLayout.of(seqs, splits)
    out = ops.attention(q, K_CACHE, V_CACHE, ops.attention_meta(layout, HEADS // KV_HEADS, q.device), 0.125)
    return [out[layout.query_starts[i] : layout.query_starts[i + 1]] for i in range(len(seqs))]


@SETTINGS
@given(seqs=st.lists(st.tuples(st.integers(1, 690), st.sampled_from([1, 1, 1, 2, 17]),
                               st.sampled_from([64, 128, 256, 320])), min_size=2, max_size=SLOTS))
def test_attention_rows_alone_equal_rows_in_a_mixed_batch(seqs: list[tuple[int, int, int]]) -> None:
    """Decoding and prefilling sequences of many lengths, each with its own KV split size, in one call."""
    layout = [(slot, min(n, ctx), ctx) for slot, (ctx, n, _) in enumerate(seqs)]
    splits = [split for _, _, split in seqs]
    together = _attend(layout, splits)
    for seq, split, out in zip(layout, splits, together):
        assert torch.equal(out, _attend([seq], [split])[0]), (seq, split)
