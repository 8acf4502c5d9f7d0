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
- Scheduling mechanisms, under the run's own kernels: the batch size alone (the reference against the
  divergent composition stripped of fillers and of every axis), and each composition axis's pair, as its file
  in flakecheck/data/axes/ declares it: chunked prefill (chunks -> whole prompts), prefix-cache reuse (cached
  -> recomputed KV), the tensor-parallel size alone (the reference against the reference at the divergent
  composition's TP size and all-reduce). Only axes the divergent composition has are candidates.

The reduction and batch-size pairs run with every axis that changes the reductions themselves (the TP size)
at the reference's setting, so that such a change never passes for one of them.

Side `a` plays the reference's part and side `b` the divergent one's, so a pair's token pair at its first
divergence compares with the run's (reference token, divergent token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flakecheck.analysis.attribution import MOE_REDUCTIONS, REDUCTIONS, SCHEDULING
from flakecheck.analysis.divergence import first_divergence
from flakecheck.data.axes.base import renamed
from flakecheck.data.compositions import AXES, Composition, Fillers
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
    mixture of experts (its router and experts are replayed apart too). The scheduling mechanisms are the batch
    size and every composition axis's (flakecheck/data/axes/), in attribution's SCHEDULING order."""
    found = []
    d, r = divergence.composition, divergence.repeat
    # the divergent composition with every axis that changes the reductions themselves (a TP size) at the
    # reference's setting: what the reduction and batch-size pairs are replayed on
    pinned: dict[str, object] = {}
    for axis in AXES:
        if axis.changes_reductions and axis.present(d, reference):
            pinned.update(axis.strip(d, reference))
    at_reference = renamed(d, "ref", **pinned) if pinned else d
    for mechanism, op_class, _ in REDUCTIONS + (MOE_REDUCTIONS if moe else ()):
        order = getattr(run_policy, op_class) or run_policy.matmul  # router, experts: as matmul unless named
        if order != "splitk":
            found.append(Pair(mechanism, "reduction", None, None, f"{op_class} is {order} in the run's kernels"))
            continue
        alone = KernelPolicy(**{op_class: "splitk"})
        found.append(Pair(mechanism, "reduction", Variant(reference, 0, alone), Variant(at_reference, r, alone)))
    by_name = {axis.name: axis for axis in AXES}
    for mechanism, _ in SCHEDULING:
        axis = by_name.get(mechanism)
        if axis is None:
            found.append(_batch_size(d, r, reference, run_policy))
        elif not axis.present(d, reference):
            found.append(Pair(mechanism, "scheduling", None, None, axis.absent(d)))
        else:
            a, b = axis.pair(d, reference)
            # a side built on the divergent composition keeps its repeat (arrival order, fillers); one built on
            # the reference is its first
            repeat = 0 if a is reference or b is reference else r
            found.append(Pair(mechanism, "scheduling", Variant(a, repeat, run_policy), Variant(b, repeat, run_policy)))
    return found


def _batch_size(d: Composition, r: int, reference: Composition, run_policy: KernelPolicy) -> Pair:
    """The reference against the divergent composition stripped of fillers and of every axis."""
    if d.max_batch == 1:
        return Pair("batch_size", "scheduling", None, None, f"{d.name} is serial (max_batch 1)")
    stripped: dict[str, object] = {"fillers": Fillers()}
    for axis in AXES:
        stripped.update(axis.strip(d, reference))
    return Pair("batch_size", "scheduling", Variant(reference, 0, run_policy),
                Variant(renamed(d, "batchonly", **stripped), r, run_policy))


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
