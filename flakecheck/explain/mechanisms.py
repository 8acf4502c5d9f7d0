"""The mechanisms a flip can come from, and the pair of replays that isolates each one (pure: no model).

Every mechanism is a pair of variants that differ in that one mechanism alone; the mechanism *alone
reproduces* a case's divergence when its pair's tokens first differ at the step where the run's did.

- Reduction mechanisms, replayed as (reference composition, divergent composition) under a policy where only
  that op class keeps the run's split order and every other class is fixed-order: matmul split-K
  (`matmul=splitk,attention=invariant,norm=invariant`), attention split-KV, norm/softmax row splits. Only
  classes that are split (`splitk`) in the run's own policy are candidates: a fixed-order class cannot flip.
  A mixture of experts adds two: the router's matmul split alone (`matmul=invariant,...,router=splitk`: a
  routing flip reproduces under it) and the routed experts' matmuls split alone (`experts=splitk`: their
  per-expert split plans, which follow the rows routed to each expert).
- Scheduling mechanisms, under the run's own kernels, each as (the divergent composition without the
  feature, the divergent composition): chunked prefill (chunks -> whole prompts), prefix-cache reuse (cached
  -> recomputed KV), the batch-size axis alone (the reference against the divergent composition stripped
  of chunking, prefix cache, fillers and its own tensor parallelism), and the tensor-parallel size alone (the
  reference against the reference at the divergent composition's TP size and all-reduce). Only features the
  divergent composition has are candidates.

The reduction and batch-size pairs run at the reference's TP size, so that a TP change never passes for one
of them.

Side `a` plays the reference's part and side `b` the divergent one's, so a pair's token pair at its first
divergence compares with the run's (reference token, divergent token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from flakecheck.analysis.attribution import MOE_REDUCTIONS, REDUCTIONS
from flakecheck.analysis.divergence import first_divergence
from flakecheck.data.compositions import Composition, Fillers
from flakecheck.explain.source import Divergence
from flakecheck.explain.targeted import Variant
from flakecheck.kernels.policy import KernelPolicy


@dataclass(frozen=True)
class Pair:
    mechanism: str
    kind: str  # reduction | scheduling
    a: Variant | None  # None: not a candidate (see reason)
    b: Variant | None
    reason: str | None = None

    @property
    def candidate(self) -> bool:
        return self.a is not None


def pairs(divergence: Divergence, reference: Composition, run_policy: KernelPolicy, moe: bool = False) -> list[Pair]:
    """Every mechanism's pair for one diverged case, candidates or not (with the reason); `moe`: the model is a
    mixture of experts (its router and experts are replayed apart too)."""
    found = []
    d, r = divergence.composition, divergence.repeat
    other_tp = (d.tp, d.allreduce) != (reference.tp, reference.allreduce) and max(d.tp, reference.tp) > 1
    # the divergent composition at the reference's TP size: what the other mechanisms are replayed on
    at_reference_tp = replace(d, name=f"{d.name[:58]}-reftp", tp=reference.tp, allreduce=reference.allreduce) \
        if other_tp else d
    for mechanism, op_class, _ in REDUCTIONS + (MOE_REDUCTIONS if moe else ()):
        order = getattr(run_policy, op_class) or run_policy.matmul  # router, experts: as matmul unless named
        if order != "splitk":
            found.append(Pair(mechanism, "reduction", None, None, f"{op_class} is {order} in the run's kernels"))
            continue
        alone = KernelPolicy(**{op_class: "splitk"})
        found.append(Pair(mechanism, "reduction", Variant(reference, 0, alone), Variant(at_reference_tp, r, alone)))
    own = Variant(d, r, run_policy)
    if d.chunk is None:
        found.append(Pair("chunked_prefill", "scheduling", None, None, f"{d.name} prefills whole prompts"))
    else:
        found.append(Pair("chunked_prefill", "scheduling", _without(own, "whole", chunk=None), own))
    if not d.prefix_cache:
        found.append(Pair("prefix_cache", "scheduling", None, None, f"{d.name} has no prefix cache"))
    else:
        found.append(Pair("prefix_cache", "scheduling", _without(own, "nocache", prefix_cache=False), own))
    if d.max_batch == 1:
        found.append(Pair("batch_size", "scheduling", None, None, f"{d.name} is serial (max_batch 1)"))
    else:
        stripped = _without(own, "batchonly", chunk=None, prefix_cache=False, fillers=Fillers(), tp=reference.tp,
                            allreduce=reference.allreduce)
        found.append(Pair("batch_size", "scheduling", Variant(reference, 0, run_policy), stripped))
    if not other_tp:
        found.append(Pair("tensor_parallel", "scheduling", None, None, f"{d.name} runs at the reference's TP size"))
    else:
        tp_alone = Variant(replace(reference, name=f"{reference.name[:56]}-tp{d.tp}", tp=d.tp, allreduce=d.allreduce),
                           0, run_policy)
        found.append(Pair("tensor_parallel", "scheduling", Variant(reference, 0, run_policy), tp_alone))
    return found


def _without(variant: Variant, suffix: str, **changes: object) -> Variant:
    """The variant's composition with `changes`, named `<name>-<suffix>`."""
    composition = variant.composition
    name = f"{composition.name[:63 - len(suffix)]}-{suffix}"
    return Variant(replace(composition, name=name, **changes), variant.repeat, variant.policy)


@dataclass(frozen=True)
class Outcome:
    """A pair's tokens compared within the window."""

    first_divergence: int | None
    token_a: int | None
    token_b: int | None


def compare(a: list[int], b: list[int]) -> Outcome:
    """Both sides' first `window` tokens (a side may be shorter: it ended there)."""
    step = first_divergence(a, b)
    if step is None:
        return Outcome(None, None, None)
    return Outcome(step, a[step] if step < len(a) else None, b[step] if step < len(b) else None)


def attribution_row(divergence: Divergence, pair: Pair, window: int, outcome: Outcome | None,
                    labels: tuple[str, str] | None, token_text: Callable[[int], str]) -> dict[str, object]:
    """One row of attribution.parquet. `token_text(id)` gives a token's text; `labels` name the two sides."""
    row: dict[str, object] = {
        "case_id": divergence.case_id, "mechanism": pair.mechanism, "kind": pair.kind,
        "candidate": pair.candidate, "reason": pair.reason, "side_a": None, "side_b": None, "window": window,
        "diverges": None, "first_divergence": None, "same_step": None, "same_tokens": None,
        "token_a": None, "token_b": None, "reproduces": False,
    }
    if outcome is None or labels is None:
        return row
    step = outcome.first_divergence
    same_step = step is not None and step == divergence.step
    row.update({
        "side_a": labels[0], "side_b": labels[1], "diverges": step is not None, "first_divergence": step,
        "same_step": same_step,
        "same_tokens": same_step and (outcome.token_a, outcome.token_b) == (divergence.ref_token,
                                                                             divergence.alt_token),
        "token_a": None if outcome.token_a is None else token_text(outcome.token_a),
        "token_b": None if outcome.token_b is None else token_text(outcome.token_b),
        "reproduces": same_step,
    })
    return row
