"""Tensor parallelism as a composition axis: the all-reduce orders and the row-parallel GEMM against sums
worked out by hand; TP 1 is the unsharded engine; simulated replay stays bitwise physical replay at every
TP size; under fixed-order kernels a TP size is bitwise across batch compositions, and the tp-invariant
order gives the same bits at every TP size; a TP size that cannot shard the model is refused (exit 2)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

import flakecheck
from flakecheck.analysis.flip.server_load import parse_load, parse_tp_sizes, sample_compositions
from flakecheck.data.compositions import Composition, Fillers, derive_name, parse_composition_spec
from flakecheck.engine import LoadedModel, build_model, load_model
from flakecheck.engine.layers.parallel import COLUMN, ROW, Sharding, sharded_linear
from flakecheck.errors import UserError
from flakecheck.kernels import FIXED, get_ops
from flakecheck.kernels.layout import ShardOrder
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.kernels.tensor_parallel import ShardedDims, all_reduce, check_size, qkv_columns, resolve_allreduce
from flakecheck.reports.facts import gather, next_command
from flakecheck.reports.html import render_html
from flakecheck.reports.markdown import render_markdown
from flakecheck.run.settings import RunConfig
from tests.test_run import cli_run
from tests.test_simulation import assert_same_traces, write_suite

BF16 = torch.bfloat16


# ------------------------------------------------------------------------------------------- by hand


def test_each_all_reduce_sums_in_its_own_order_and_precision() -> None:
    """Three ranks' partials 1, 2^-8, 2^-8 in every column. In fp32, 1 + 2^-8 + 2^-8 = 1 + 2^-7, a bf16 value;
    rounded to bf16 after each hop, 1 + 2^-8 is a tie that rounds to even (1), so the two small partials are
    lost unless they meet first. oneshot (fp32, rank order): 1 + 2^-7 everywhere. tree ((r0 + r1) + r2, each
    rounded): 1 everywhere. ring: chunk c's sum starts at rank c+1, so chunk 0 adds r1 + r2 = 2^-7 first
    (exact) and keeps it; chunks 1 and 2 start next to rank 0 and lose them."""
    small = 2.0**-8
    partials = [torch.full((1, 3), v, dtype=BF16) for v in (1.0, small, small)]
    kept, lost = 1.0 + 2.0**-7, 1.0
    assert all_reduce(partials, "oneshot").tolist() == [[kept, kept, kept]]
    assert all_reduce(partials, "tree").tolist() == [[lost, lost, lost]]
    assert all_reduce(partials, "ring").tolist() == [[kept, lost, lost]]
    assert all_reduce(partials[:1], "ring") is partials[0]


def test_auto_picks_oneshot_for_small_messages_and_ring_above_the_documented_limits() -> None:
    assert resolve_allreduce("auto", 1, 10**9) == "none"
    assert resolve_allreduce("auto", 2, 512 * 1024) == "oneshot"
    assert resolve_allreduce("auto", 4, 512 * 1024 + 1) == "ring"
    assert resolve_allreduce("auto", 8, 256 * 1024) == "oneshot"
    assert resolve_allreduce("auto", 8, 256 * 1024 + 1) == "ring"
    assert resolve_allreduce("auto", 16, 1) == "ring"
    assert resolve_allreduce("tree", 4, 1) == "tree"


@pytest.mark.parametrize("order", [FIXED, 2])
def test_row_parallel_gemm_summed_in_fp32_in_rank_order_equals_the_hand_computed_shards(order: int) -> None:
    """x @ W.T over K = 192 held by 3 ranks (64 columns each), all-reduced one-shot. Small integers make every
    partial GEMM exact in fp32 whatever its order (|partial| <= 64 * 49 < 2^24), so the reference is computed
    by hand in float64: each rank's partial rounded to bf16 (values past 256 lose bits there), the three
    added in rank order, the sum rounded to bf16 once."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-7, 8, (5, 192), generator=gen).to(BF16)
    w = torch.randint(-7, 8, (48, 192), generator=gen).to(BF16)
    ops = get_ops(KernelPolicy.of("invariant" if order == FIXED else "splitk"), "torch")
    sharding = Sharding(ROW, lambda n: [torch.arange(r * 64, (r + 1) * 64) for r in range(n)])
    full = ops.prepare_linear(w)
    shards = sharding.weights(ops, w, None, 3)
    got = sharded_linear(ops, x, full, shards, ROW, sharding.columns(3, x.device), ShardOrder(3, "oneshot", order))

    x64, w64 = x.double(), w.double()
    partials = [(x64[:, r * 64:(r + 1) * 64] @ w64[:, r * 64:(r + 1) * 64].T).to(BF16) for r in range(3)]
    reference = (partials[0].double() + partials[1].double() + partials[2].double()).to(BF16)
    assert torch.equal(got, reference)
    assert not torch.equal(reference, (x64 @ w64.T).to(BF16))  # the partials' rounding does show here


def test_qkv_columns_give_each_rank_its_query_heads_and_split_or_replicated_kv_heads() -> None:
    dims = ShardedDims(heads=4, kv_heads=2, head_dim=1, intermediate=8, vocab=64, hidden=4)
    # fused rows: q heads 0-3 at 0..3, k heads 0-1 at 4..5, v heads 0-1 at 6..7
    assert [c.tolist() for c in qkv_columns(dims, 2)] == [[0, 1, 4, 6], [2, 3, 5, 7]]
    assert [c.tolist() for c in qkv_columns(dims, 4)] == [[0, 4, 6], [1, 4, 6], [2, 5, 7], [3, 5, 7]]


@pytest.mark.parametrize("dims, size, tp_invariant, names", [
    (ShardedDims(9, 3, 64, 1536, 49152, 576), 2, False, "num_attention_heads"),
    (ShardedDims(6, 6, 64, 100, 512, 384), 3, False, "intermediate_size"),
    (ShardedDims(8, 3, 64, 512, 512, 512), 2, False, "num_key_value_heads"),
    (ShardedDims(4, 2, 64, 768, 100, 256), 2, True, "vocabulary"),
])
def test_a_tp_size_that_cannot_shard_the_model_names_the_dimension(dims, size, tp_invariant, names) -> None:
    with pytest.raises(ValueError, match=names):
        check_size(dims, size, tp_invariant)


def test_smollm2_shapes_shard_at_3_and_9_only() -> None:
    smollm2 = ShardedDims(9, 3, 64, 1536, 49152, 576)
    for size in (1, 3):
        check_size(smollm2, size, tp_invariant=True)
    for size in (2, 4, 8):
        with pytest.raises(ValueError):
            check_size(smollm2, size)


def test_tp_and_allreduce_are_composition_fields() -> None:
    c = parse_composition_spec("name=tp3,tp=3,max_batch=8")
    assert (c.tp, c.allreduce, c.max_batch) == (3, "auto", 8)
    assert parse_composition_spec(c.to_spec()) == c and Composition.from_dict(c.to_dict()) == c
    assert c.to_dict()["tp"] == 3 and c.to_dict()["allreduce"] == "auto"  # meta.json records both
    assert derive_name(Composition("x", tp=2, allreduce="tree")) == "tp2-tree"
    assert parse_composition_spec("tp=4,allreduce=ring").name == "tp4-ring"
    for bad, field in (("tp=0", "tp"), ("tp=two", "tp"), ("tp=2,allreduce=nccl", "allreduce")):
        with pytest.raises(UserError, match=field):
            parse_composition_spec(bad)


# ------------------------------------------------------------------------------------- in the engine


@pytest.fixture(scope="module")
def wide(tiny_wide_model_dir: Path) -> LoadedModel:
    """4 query heads, 2 KV heads, intermediate 768: TP 2 splits the KV heads, TP 4 replicates them."""
    return load_model(str(tiny_wide_model_dir), "bfloat16")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("tp") / "tp.jsonl")


@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_one_rank_is_the_unsharded_projection(wide: LoadedModel, kernels: str) -> None:
    """Through the sharded path, a single rank computes every projection (and the LM head) bit for bit as the
    unsharded layer does."""
    network = build_model(wide, get_ops(KernelPolicy.of(kernels), "torch"))
    layer = network.layers[0]
    x = torch.randn(7, wide.config.hidden_size).to(BF16)
    for proj, width in ((layer.attn.qkv, None), (layer.mlp.gate_up, None), (layer.attn.o_proj, 256),
                        (layer.mlp.down, 768), (network.lm_head.proj, None)):
        inputs = x if width is None else torch.randn(7, width).to(BF16)
        assert proj.sharding is not None
        key = ShardOrder(1, "none", FIXED if kernels == "invariant" else 3)
        shards = proj.sharding.weights(network.ops, proj.weights.weight, proj.weights.bias, 1)
        one_rank = sharded_linear(network.ops, inputs, proj.weights, shards, proj.sharding.kind,
                                  proj.sharding.columns(1, inputs.device), key)
        assert torch.equal(one_rank, network.ops.linear(inputs, proj.weights, groups=((key.order, slice(None)),)))
    assert {p.sharding.kind for p in (layer.attn.qkv, layer.mlp.gate_up)} == {COLUMN}


TP_COMPOSITIONS = [Composition("solo"),
                   Composition("tp4-b4", tp=4, max_batch=4, order_seed=2),  # KV heads replicated
                   Composition("tp2-ring-c7", tp=2, allreduce="ring", max_batch=3, chunk=7),
                   Composition("tp4-tree-prefix", tp=4, allreduce="tree", max_batch=4, prefix_cache=True),
                   Composition("tp2-oneshot-fill", tp=2, allreduce="oneshot", max_batch=5,
                               fillers=Fillers(count=3, prompt_len=(3, 30)))]


@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_simulated_replay_is_bitwise_physical_replay_at_every_tp_size(wide, suite, tmp_path, kernels) -> None:
    runs = {mode: flakecheck.run_suite(suite, model=wide, out=tmp_path / mode, html=False, replay=mode,
                                       kernels=kernels, compositions=TP_COMPOSITIONS, max_tokens=6)
            for mode in ("physical", "simulated")}
    assert_same_traces(runs["physical"], runs["simulated"])
    # not vacuous: the TP sizes do change tokens (under fixed-order kernels too: their all-reduce is not)
    assert runs["simulated"].runs.first_divergence.notna().any()
    assert [c["tp"] for c in runs["simulated"].meta["compositions"]] == [1, 4, 2, 4, 2]


def _traces(run) -> pd.DataFrame:
    """Per (composition, case): the tokens and their logprobs, the top-2 too."""
    tokens = run.tokens.sort_values(["composition", "case_id", "step"])
    return tokens.groupby(["composition", "case_id"])[["token_id", "logprob", "top2_id", "top2_logprob"]].agg(tuple)


def _by_composition(run) -> dict[str, pd.DataFrame]:
    traces = _traces(run)
    return {name: traces.xs(name, level="composition") for name in traces.index.get_level_values(0).unique()}


BATCHES = [("solo", {}), ("b4", {"max_batch": 4, "order_seed": 1}), ("c7", {"max_batch": 3, "chunk": 7})]


def _grid(sizes: tuple[int, ...]) -> list[Composition]:
    grid = [Composition(f"tp{n}-{label}" if (n, label) != (1, "solo") else "solo", tp=n, **fields)
            for n in sizes for label, fields in BATCHES]
    return grid


def test_invariant_kernels_are_bitwise_across_batches_at_each_tp_size_but_not_across_sizes(wide, suite,
                                                                                           tmp_path) -> None:
    run = flakecheck.run_suite(suite, model=wide, out=tmp_path / "inv", html=False, kernels="invariant",
                               compositions=_grid((1, 2, 4)), max_tokens=8)
    traces = _by_composition(run)
    for n in (1, 2, 4):
        names = [c.name for c in _grid((n,))]
        for name in names[1:]:
            pd.testing.assert_frame_equal(traces[names[0]], traces[name], check_exact=True)
    assert not traces["solo"].equals(traces["tp4-solo"])  # the all-reduce's order is a composition axis
    # the reports name those flips as TP-only: every diverged case, since no batch at TP 1 diverges
    facts = gather(run)
    diverged = sorted(run.cases.case_id[run.cases.status.isin(["flaky", "verdict_flaky"])].astype(str))
    assert diverged and facts.tp_only_flips == diverged
    markdown = render_markdown(run)
    assert f"TP-only flips ({len(diverged)})" in markdown and "tp4-b4 (tp 4, auto)" in markdown
    html = render_html(run)
    assert f"{len(diverged)} TP-only flip" in html and "tp4-b4 (tp 4, auto)" in html
    assert facts.score.cause == "batch composition and TP size"  # a score swing says the TP size moved it too
    assert "from batch composition alone" not in markdown + html
    assert "--kernels tp-invariant" in next_command(facts)[1]  # fixed-order kernels would not hold them
    meta = json.loads((run.path / "meta.json").read_text())
    assert {(c["name"], c["tp"], c["allreduce"]) for c in meta["compositions"]} >= {("tp2-c7", 2, "auto")}


def test_the_tp_invariant_order_gives_the_same_bits_at_every_tp_size(wide, suite, tmp_path) -> None:
    run = flakecheck.run_suite(suite, model=wide, out=tmp_path / "tpinv", html=False, kernels="tp-invariant",
                               compositions=_grid((1, 2, 4)), max_tokens=8)
    traces = _by_composition(run)
    for name, trace in traces.items():
        pd.testing.assert_frame_equal(traces["solo"], trace, check_exact=True, obj=name)
    assert (run.cases.status.isin(["stable", "fragile"])).all()


@pytest.mark.parametrize("spec, dimension", [("tp=3", "num_attention_heads"), ("tp=8", "num_attention_heads")])
def test_a_tp_size_the_model_cannot_shard_is_exit_2_and_writes_nothing(tiny_wide_model_dir, suite, tmp_path,
                                                                        monkeypatch, capsys, spec, dimension) -> None:
    out = tmp_path / "out"
    code, _, err = cli_run(monkeypatch, capsys, "run", str(suite), "--model", str(tiny_wide_model_dir), "--out",
                           str(out), "--quiet", "--composition", f"name=bad,{spec}")
    assert code == 2, err
    assert dimension in err and "bad" in err
    assert not out.exists()


def test_sampled_compositions_draw_tp_sizes_and_leave_the_other_axes_as_they_were() -> None:
    load = parse_load("poisson:8")
    plain = sample_compositions(load, 40, 3)
    with_tp = sample_compositions(load, 40, 3, (1, 2, 4, 8))
    assert [replace(c, tp=1) for c in with_tp] == plain and {c.tp for c in plain} == {1}
    assert {c.tp for c in with_tp} == {1, 2, 4, 8}
    config = RunConfig.parse("suite.jsonl", sample=40, sample_seed=3, sample_tp="1,2,4,8")
    assert config.draws and "--tp 1,2,4,8" in config.command()
    assert RunConfig.from_dict(config.to_dict()).compositions == config.compositions  # read back from meta.json
    for bad in ("0", "two", "", "1,,2"):
        with pytest.raises(UserError, match="--tp"):
            parse_tp_sizes(bad)


def test_explain_attributes_tp_only_flips_to_the_tp_size_and_prices_the_tp_fixes(wide, suite, tmp_path) -> None:
    """Under fixed-order kernels only the TP size moves tokens: each flip is the TP change's alone, pinning the
    TP size or the tp-invariant order stabilises every case, and fixed-order kernels (already the run's) none."""
    compositions = [Composition("solo"), Composition("b4", max_batch=4), Composition("tp4-b4", tp=4, max_batch=4),
                    Composition("tp2-ring", tp=2, allreduce="ring", max_batch=3)]
    run = flakecheck.run_suite(suite, model=wide, out=tmp_path / "run", html=False, kernels="invariant",
                               compositions=compositions, max_tokens=8)
    flipped = sorted(run.cases.case_id[run.cases.status.isin(["flaky", "verdict_flaky"])].astype(str))
    assert flipped, "TP sizes must flip some case here for the test to mean anything"
    explained = flakecheck.explain_run(run.path, model=wide, steps_after=1, cost_repeats=1)
    rows = explained.attribution
    tp_rows = rows[rows.mechanism == "tensor_parallel"].set_index("case_id")
    assert tp_rows.candidate.all() and tp_rows.reproduces.all()
    assert not rows[(rows.kind == "reduction")].candidate.any()  # no split reduction in the run's kernels
    for summary in explained.explain["cases"].values():
        assert "tensor_parallel" in summary["mechanisms"]
    fixes = explained.fixes.set_index("fix")
    for fix in ("pin_tp", "tp_invariant"):
        assert fixes.loc[fix, "full_fix"] and fixes.loc[fix, "stabilised"] == len(flipped), fix
    assert fixes.loc["fixed_all", "stabilised"] == 0
    assert fixes.loc["tp_invariant", "cost_factor"] > 0 and "decode step" in fixes.loc["tp_invariant", "cost"]
    assert "deployment" in fixes.loc["pin_tp", "cost"]
