"""Routing in the traces of a mixture of experts: per generated token the experts every sparse layer chose for
the row that produced it and the smallest k-th/(k+1)-th router gap (and its layer), as transformers' own router
computes them; per (case, composition) the first step whose experts differ from the reference's; dense models
and old run directories carry none and still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import flakecheck
from flakecheck.analysis.divergence import Thresholds, analyse
from flakecheck.analysis.flip_kind import classify_flip
from flakecheck.data.compositions import Composition
from flakecheck.data.routing import routing_digest, routing_divergence
from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace
from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt, load_model
from flakecheck.reports.markdown import render_markdown

TOKENS = 4


def test_the_engines_routing_is_transformers_router(tiny_model_factory) -> None:
    """fp32 Mixtral: per generated token, the experts of every layer and the smallest top-k margin are those of
    transformers' router logits at the row that produced the token."""
    from transformers import AutoModelForCausalLM

    path = tiny_model_factory("mixtral")
    model = load_model(str(path), "float32")
    prompt = encode_prompt(model, [{"role": "user", "content": "Name three colours."}])
    [done] = LLMEngine(model).generate([Request(0, prompt, SamplingParams(TOKENS, ignore_eos=True))])
    assert done.routing is not None and len(done.routing) == TOKENS
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        out = hf(torch.tensor([prompt + done.token_ids]), output_router_logits=True)
    k = hf.config.num_experts_per_tok
    for step, routing in enumerate(done.routing):
        row = len(prompt) - 1 + step
        probs = [torch.softmax(layer.reshape(-1, layer.shape[-1])[row].float(), -1) for layer in out.router_logits]
        ranked = [p.sort(descending=True) for p in probs]
        assert [set(e) for e in routing.experts] == [set(order[:k].tolist()) for _, order in ranked]
        margins = [float(v[k - 1] - v[k]) for v, _ in ranked]
        assert routing.margin == pytest.approx(min(margins), abs=1e-5)
        assert margins[routing.layer] == pytest.approx(routing.margin, abs=1e-5)


@given(st.lists(st.lists(st.integers(0, 63), min_size=2, max_size=2), min_size=1, max_size=4), st.randoms())
def test_a_digest_is_of_each_layers_set_of_experts(layers: list[list[int]], rnd) -> None:  # type: ignore[no-untyped-def]
    shuffled = [rnd.sample(layer, len(layer)) for layer in layers]
    assert routing_digest(shuffled) == routing_digest(layers)
    other = [list(layer) for layer in layers]
    other[-1][0] = 64  # an expert no layer above chose
    assert routing_digest(other) != routing_digest(layers)


@given(st.lists(st.integers(-5, 5), max_size=8), st.lists(st.integers(-5, 5), max_size=8))
def test_a_routing_divergence_is_the_first_differing_step(a: list[int], b: list[int]) -> None:
    step = routing_divergence(a, b)
    if step is None:
        assert not a or not b or a[:len(b)] == b[:len(a)]
    else:
        assert a[:step] == b[:step] and a[step] != b[step]
    assert routing_divergence(None, b) is None


def _suite(tmp_path: Path, n: int = 3) -> Path:
    suite = tmp_path / "s.jsonl"
    suite.write_text("".join(json.dumps({"id": f"q{i}", "input": f"Count to {i + 3}.", "max_tokens": TOKENS}) + "\n"
                             for i in range(n)))
    return suite


COMPOSITIONS = [Composition("solo"), Composition("batch4", max_batch=4, chunk=7)]


def test_a_moe_runs_tables_carry_routing_and_invariant_never_diverges(tiny_model_factory, tmp_path: Path) -> None:
    model = load_model(str(tiny_model_factory("qwen3-moe")), "bfloat16")  # layer 0 dense: never the margin's layer
    run = flakecheck.run_suite(_suite(tmp_path), model=model, out=tmp_path / "run", html=False,
                               kernels="invariant", compositions=COMPOSITIONS)
    assert run.tokens["routing_margin"].notna().all() and (run.tokens["routing_margin"] >= 0).all()
    assert set(run.tokens["routing_layer"]) <= {1}  # the one sparse layer
    assert run.runs["routing_divergence"].isna().all(), "fixed-order kernels: the same experts in every composition"


def test_dense_traces_carry_no_routing_and_old_run_directories_still_render(tiny_model_dir, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    run = flakecheck.run_suite(_suite(tmp_path, 2), model=load_model(str(tiny_model_dir), "bfloat16"),
                               out=tmp_path / "run", html=False, kernels="splitk", compositions=COMPOSITIONS)
    assert run.tokens["routing_margin"].isna().all() and run.runs["routing_divergence"].isna().all()
    for name, column in (("tokens", "routing_margin"), ("tokens", "routing_layer"), ("runs", "routing_divergence")):
        path = tmp_path / "run" / f"{name}.parquet"
        table = pq.read_table(path)
        pq.write_table(table.drop_columns([column]), path)  # as a run directory written before MoE routing
    old = flakecheck.load_run(tmp_path / "run")
    assert "routing_margin" not in old.tokens
    assert render_markdown(old) == render_markdown(run), "a dense run renders the same with or without the columns"



# ------------------------------------------------------------------------------------- the routing flip kind

def _routed(case_id: str, comp: str, ids: list[int], gap: float, experts: list[int]) -> Trace:
    """A trace whose every step has top-1/top-2 gap `gap` and, per step, one digest of its experts."""
    top1 = [-0.1] * len(ids)
    return Trace(case_id, comp, 0, ids, ids, top1, [i + 1 for i in ids], [lp - gap for lp in top1], "length",
                 routing_margins=[0.01] * len(ids), routing_layers=[0] * len(ids), routing_digests=experts)


@given(st.integers(0, 5), st.integers(0, 6), st.sampled_from([0.0, 0.02, 3.0]))
def test_a_routing_flip_is_a_confident_gap_with_other_experts_at_or_before_it(
        diverge: int, rerouted: int, gap: float) -> None:
    n = 6
    ref_ids = [1] * n
    alt_ids = [1] * diverge + [2] * (n - diverge)
    alt_experts = [0] * rerouted + [1] * (n - rerouted)
    traces = [_routed("a", "solo", ref_ids, gap, [0] * n), _routed("a", "batch", alt_ids, gap, alt_experts)]
    tables = analyse(traces, [Case("a", "q", (), (), None, {}, 1)], "solo", Thresholds(0.05, 50), lambda ids: "",
                     str, verdicts={("a", "solo", 0): None, ("a", "batch", 0): None}, dtype="bfloat16")
    alt = next(r for r in tables.runs if r["composition"] == "batch")
    assert alt["first_divergence"] == diverge
    assert alt["routing_divergence"] == (rerouted if rerouted < n else None)
    without = classify_flip(gap, None, "bfloat16", 0.05, tables.gap_noise)
    kind = tables.cases[0]["flip_kind"]
    if without == "confident" and rerouted <= diverge:
        assert kind == "routing"
    else:
        assert kind == without, "a tie or near-tie keeps its kind; other experts after the flip do not explain it"


def test_every_report_format_counts_routing_flips(tmp_path: Path) -> None:
    """A constructed MoE run: one routing flip, one near-tie flip (its experts changed too), one stable case."""
    import io

    from rich.console import Console

    from flakecheck.reports.html import render_html
    from flakecheck.reports.json_report import render_json
    from flakecheck.reports.terminal import render_summary
    from tests.run_builder import CaseSpec, RunSpec, write_run

    n = 4
    traces = [_routed("r", "solo", [3] * n, 3.0, [0] * n), _routed("r", "batch", [3, 3, 4, 4], 3.0, [0, 1, 1, 1]),
              _routed("t", "solo", [3] * n, 0.02, [0] * n), _routed("t", "batch", [3, 4, 4, 4], 0.02, [0, 1, 1, 1]),
              _routed("s", "solo", [3] * n, 3.0, [0] * n), _routed("s", "batch", [3] * n, 3.0, [0] * n)]
    spec = RunSpec(["solo", "batch"], [CaseSpec(c, None, [], []) for c in ("r", "t", "s")])
    run = write_run(tmp_path / "run", spec, traces)
    assert dict(zip(run.cases.case_id, run.cases.flip_kind.fillna("-"))) == {"r": "routing", "t": "near_tie",
                                                                                "s": "-"}
    out = io.StringIO()
    render_summary(run, Console(file=out, width=200, color_system=None))
    expected = "0 tie · 1 near_tie · 0 confident · 1 routing"
    for text in (out.getvalue(), render_markdown(run), render_html(run)):
        assert expected in text
        assert "other experts in 2 of 3 cases" in text
    assert json.loads(render_json(run))["flips"]["counts"]["routing"] == 1


# ------------------------------------------------------------------- explain: the router and the experts apart

@pytest.mark.parametrize("alone", ["router", "experts"])
def test_a_policy_splits_the_router_or_the_experts_alone(alone: str, tiny_wide_factory) -> None:
    from flakecheck.engine.models import model_dims
    from flakecheck.kernels import StepShape
    from flakecheck.kernels.plan import FIXED
    from flakecheck.kernels.policy import KernelPolicy, parse_policy, plan_step

    dims = model_dims(load_model(str(tiny_wide_factory("mixtral")), "bfloat16").config)
    policy = KernelPolicy(**{alone: "splitk"})
    assert parse_policy(policy.name) == policy and policy.matmul_orders == {"invariant", "splitk"}
    plans = [plan_step(policy, StepShape((m,), (m,), 1), dims, 132) for m in (1, 40)]
    for plan in plans:
        assert all(order == FIXED for nk, order in plan.projections if nk != dims.router)
        assert plan.experts is not None and plan.lm_head == FIXED
    router = {plan.projection(*dims.router) for plan in plans}
    experts = {plan.experts.order(m, *dims.experts[-1]) for plan in plans for m in (1, 30)}  # type: ignore[union-attr]
    split, fixed = (router, experts) if alone == "router" else (experts, router)
    assert fixed == {FIXED} and FIXED not in split


def test_explain_replays_the_router_and_the_experts_only_for_a_moe() -> None:
    from flakecheck.explain.mechanisms import pairs
    from flakecheck.explain.source import Divergence
    from flakecheck.kernels.policy import KernelPolicy

    divergence = Divergence("a", 3, COMPOSITIONS[1], 0, 1, 2, False)
    splitk = KernelPolicy.of("splitk")
    moe = {p.mechanism: p for p in pairs(divergence, COMPOSITIONS[0], splitk, moe=True)}
    dense = {p.mechanism for p in pairs(divergence, COMPOSITIONS[0], splitk)}
    assert {"router_splitk", "experts_splitk"} <= set(moe) and not dense & {"router_splitk", "experts_splitk"}
    for mechanism, alone in (("router_splitk", "router"), ("experts_splitk", "experts")):
        pair = moe[mechanism]
        assert pair.a is not None and pair.b is not None and pair.a.policy == pair.b.policy
        assert pair.a.policy == KernelPolicy(**{alone: "splitk"})  # every other matmul, attention, norm fixed
    fixed_router = {p.mechanism: p.candidate for p in pairs(divergence, COMPOSITIONS[0],
                                                             KernelPolicy("splitk", "splitk", "splitk", "invariant"),
                                                             moe=True)}
    assert fixed_router["router_splitk"] is False and fixed_router["experts_splitk"] is True
