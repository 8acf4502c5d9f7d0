"""The candidate fixes for a suite's flips, measured by replay: each fix is applied to every composition of
the run (its kernels, or a scheduling setting; each composition axis declares its own: flakecheck/data/axes/),
the flaky cases are replayed under every fixed composition
(one lockstep for all fixes; a fixed composition that computes what a recorded one computed reuses the
recorded tokens), and a case is stabilised when its tokens are then identical under every composition.
Verdicts of the fixed outputs are graded as the run graded them (checks, or the grader), to count the
verdict flips left. Costs are measured separately (flakecheck.explain.costs); ranking puts the cheapest full
fix first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flakecheck.analysis.verdicts import grade_traces
from flakecheck.data.axes.base import Axis, AxisFix
from flakecheck.data.compositions import AXES, Composition
from flakecheck.data.traces import Trace, run_label
from flakecheck.explain.source import Divergence, RunSource
from flakecheck.explain.targeted import Replays, Variant, computation_key
from flakecheck.grading.external import GraderSpec
from flakecheck.kernels.policy import KernelPolicy

ALL_FIXED = {"matmul": "invariant", "attention": "invariant", "norm": "invariant"}


@dataclass(frozen=True)
class Fix:
    id: str
    label: str
    vllm: str  # the production setting that corresponds
    sglang: str
    kernels: Mapping[str, str] = field(default_factory=dict)  # op class -> order
    # (composition, the reference) -> the composition fields the fix sets
    changes: Callable[[Composition, Composition], Mapping[str, Any]] = lambda composition, reference: {}

    def apply(self, composition: Composition, repeat: int, policy: KernelPolicy, reference: Composition) -> Variant:
        return Variant(replace(composition, **self.changes(composition, reference)), repeat,
                       replace(policy, **self.kernels))

    @classmethod
    def of(cls, declared: AxisFix) -> Fix:
        """An axis's fix (flakecheck/data/axes/)."""
        return cls(declared.id, declared.label, declared.vllm, declared.sglang, declared.kernels, declared.changes)


# Flag names as vLLM and SGLang document them: vLLM's batch invariance is one switch for every reduction
# (VLLM_BATCH_INVARIANT=1), SGLang's deterministic inference likewise; neither fixes one op class alone. Each
# composition axis adds its own (flakecheck/data/axes/).
FIXES = (
    Fix("fixed_matmul", "fixed-order matmuls only", "no separate switch (part of VLLM_BATCH_INVARIANT=1)",
        "no separate switch (part of --enable-deterministic-inference)", kernels={"matmul": "invariant"}),
    Fix("fixed_attention", "fixed-order attention only", "no separate switch (part of VLLM_BATCH_INVARIANT=1)",
        "no separate switch (part of --enable-deterministic-inference)", kernels={"attention": "invariant"}),
    Fix("fixed_all", "all fixed-order kernels", "VLLM_BATCH_INVARIANT=1", "--enable-deterministic-inference",
        kernels=ALL_FIXED),
    Fix("serial", "serial requests (max batch 1)", "--max-num-seqs 1", "--max-running-requests 1",
        changes=lambda composition, reference: {"max_batch": 1}),
)


# a mixture of experts: the router's matmul fixed-order alone (removes routing flips), the experts' alone
MOE_FIXES = (
    Fix("fixed_router", "fixed-order router matmul only", "no separate switch (part of VLLM_BATCH_INVARIANT=1)",
        "no separate switch (part of --enable-deterministic-inference)", kernels={"router": "invariant"}),
    Fix("fixed_experts", "fixed-order expert matmuls only (one tiling whatever the tokens per expert)",
        "no separate switch (part of VLLM_BATCH_INVARIANT=1; not for FP8 fused MoE)",
        "no separate switch (part of --enable-deterministic-inference)", kernels={"experts": "invariant"}),
)


def offering_axes(source: RunSource) -> list[Axis]:
    """The composition axes whose fixes a run is offered: an axis says where (the TP size's only where some
    composition runs at another TP size or all-reduce than the reference's: elsewhere there is none to fix)."""
    compositions = [c for c, _ in source.work]
    return [axis for axis in AXES if axis.offers_fixes(compositions, source.reference)]


def fixes_for(source: RunSource) -> tuple[Fix, ...]:
    """The candidate fixes of a run: the kernels' and serial requests', each offering axis's, and the router's
    and the experts' only for a mixture of experts."""
    fixes = FIXES + tuple(Fix.of(f) for axis in offering_axes(source) for f in axis.fixes)
    return fixes + MOE_FIXES if source.moe else fixes


@dataclass
class FixResult:
    fix: Fix
    changes: list[str]  # the compositions the fix changes
    replayed: list[str]  # ... that matched no recorded composition (replayed)
    outputs: dict[str, list[tuple[str, int, list[int], str]]]  # case -> (composition, repeat, tokens, finish)
    stabilised: list[str] = field(default_factory=list)
    still_flaky: list[str] = field(default_factory=list)
    verdict_flips: list[str] = field(default_factory=list)


def plan_fixes(source: RunSource, flaky: Sequence[Divergence], replays: Replays) -> None:
    """Ask `replays` for every flaky case under every composition of the run, each fix applied."""
    for fix in fixes_for(source):
        for composition, repeat in source.work:
            variant = fix.apply(composition, repeat, source.policy, source.reference)
            for divergence in flaky:
                replays.need(variant, divergence.case_id)


def evaluate_fixes(source: RunSource, flaky: Sequence[Divergence], replays: Replays,
                   decode: Callable[[list[int]], str], grader: GraderSpec | None) -> list[FixResult]:
    """After `replays` ran: per fix, which flaky cases it stabilises and which verdict flips remain."""
    results = []
    for fix in fixes_for(source):
        changes, replayed = [], []
        outputs: dict[str, list[tuple[str, int, list[int], str]]] = {d.case_id: [] for d in flaky}
        for composition, repeat in source.work:
            variant = fix.apply(composition, repeat, source.policy, source.reference)
            label = run_label(composition.name, repeat)
            if computation_key(variant) != computation_key(Variant(composition, repeat, source.policy)):
                changes.append(label)
                if not replays.is_recorded(variant):
                    replayed.append(label)
            for d in flaky:
                outputs[d.case_id].append((composition.name, repeat, replays.tokens(variant, d.case_id),
                                           replays.finish_reason(variant, d.case_id)))
        result = FixResult(fix, changes, replayed, outputs)
        for case_id, outs in outputs.items():
            same = len({tuple(tokens) for _, _, tokens, _ in outs}) == 1
            (result.stabilised if same else result.still_flaky).append(case_id)
        results.append(result)
    _grade(results, source, decode, grader)
    return results


def _grade(results: list[FixResult], source: RunSource, decode: Callable[[list[int]], str],
           grader: GraderSpec | None) -> None:
    """Every fixed output graded once (a grader sees the composition as 'fix/composition')."""
    traces = [Trace(case_id, f"{r.fix.id}/{name}", repeat, tokens, [], [], [], [], finish)
              for r in results for case_id, outs in r.outputs.items() for name, repeat, tokens, finish in outs]
    if not traces:
        return
    verdicts = grade_traces(traces, source.suite.cases, decode, grader)
    for r in results:
        for case_id, outs in r.outputs.items():
            graded = {verdicts[(case_id, f"{r.fix.id}/{name}", repeat)] for name, repeat, _, _ in outs}
            if len(graded - {None}) > 1:
                r.verdict_flips.append(case_id)


@dataclass(frozen=True)
class Cost:
    factor: float | None  # measured slowdown of the work the fix touches (None: nothing to measure)
    text: str


def fix_rows(results: Sequence[FixResult], flaky: Sequence[Divergence], costs: Mapping[str, Cost]) -> list[dict]:
    """fixes.parquet rows, ranked: full fixes first, cheapest first; then by cases stabilised, then cost."""
    flips_before = sum(d.verdict_flip for d in flaky)
    rows = []
    for r in results:
        cost = costs.get(r.fix.id, Cost(None, "not measured"))
        if not r.changes:
            cost = Cost(None, "nothing to change: no composition of this run uses what it removes")
        rows.append({
            "fix": r.fix.id, "label": r.fix.label, "changes": r.changes, "replayed": r.replayed,
            "flaky_cases": len(flaky), "stabilised": len(r.stabilised), "still_flaky": r.still_flaky,
            "full_fix": bool(flaky) and not r.still_flaky, "verdict_flips_before": flips_before,
            "verdict_flips_after": len(r.verdict_flips), "cost_factor": cost.factor, "cost": cost.text,
            "vllm": r.fix.vllm, "sglang": r.fix.sglang,
        })
    rows.sort(key=lambda row: (not row["full_fix"], -row["stabilised"],
                               math.inf if row["cost_factor"] is None else row["cost_factor"]))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    return rows
