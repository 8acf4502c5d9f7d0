"""Tensor parallelism: `tp` ranks each compute a shard of every projection, and an all-reduce (`allreduce`:
auto | ring | tree | oneshot; see flakecheck/kernels/tensor_parallel.py) sums their partials. A TP size
changes the reductions themselves, so explain replays every other mechanism at the reference's TP size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from flakecheck.data.axes.base import Axis, AxisField, AxisFix, integer, integer_text, string, string_text

# the all-reduce orders (kernels/tensor_parallel.ALLREDUCES, spelled here: data/ sits below kernels/)
ALLREDUCES = ("auto", "ring", "tree", "oneshot")


def other_tp(c: Any, reference: Any) -> bool:
    """Whether a composition runs at another TP size (or all-reduce) than the reference, beyond one rank."""
    return (c.tp, c.allreduce) != (reference.tp, reference.allreduce) and max(c.tp, reference.tp) > 1


def _varies(compositions: Sequence[Any], reference: Any) -> bool:
    return any(other_tp(c, reference) for c in compositions)


def _name(c: Any) -> str | None:
    parts = ([f"tp{c.tp}"] if c.tp != 1 else []) + ([c.allreduce] if c.allreduce != "auto" else [])
    return "-".join(parts) or None


def _pin(c: Any, reference: Any) -> dict[str, Any]:
    return {"tp": reference.tp, "allreduce": reference.allreduce}


AXIS = Axis(
    name="tensor_parallel", label="tensor-parallel size", rank=70,
    fields=(AxisField("tp", "int", 1, integer, integer_text, lambda v: None if v >= 1 else f"tp must be >= 1, got {v}",
                      example=2),
            AxisField("allreduce", "str", "auto", string, string_text,
                      lambda v: None if v in ALLREDUCES else
                      f"allreduce must be one of {', '.join(ALLREDUCES)}, got {v!r}", example="ring")),
    name_part=_name,
    # one rank sums nothing: its all-reduce is none whatever the composition names
    engine=lambda c: {"tp_size": c.tp, "allreduce": c.allreduce if c.tp > 1 else "none"},
    present=other_tp,
    absent=lambda c: f"{c.name} runs at the reference's TP size",
    strip=_pin,
    # the reference against the reference at the divergent composition's TP size and all-reduce
    pair=lambda d, reference: (reference, replace(reference, name=f"{reference.name[:56]}-tp{d.tp}", tp=d.tp,
                                                  allreduce=d.allreduce)),
    changes_reductions=True,
    # TP sizes: one --tensor-parallel-size for every server the suite meets; or reductions whose order no TP
    # size changes, which neither engine offers (TP-invariant kernels are research: TBIK)
    fixes=(AxisFix("pin_tp", "pin the TP size", "the same --tensor-parallel-size on every server",
                   "the same --tp-size on every server", changes=_pin),
           AxisFix("tp_invariant", "tp-invariant reductions", "no switch (batch invariance does not cover a TP change)",
                   "no switch (deterministic inference does not cover a TP change)",
                   kernels={"matmul": "tp-invariant", "attention": "tp-invariant", "norm": "tp-invariant"})),
    # elsewhere there is no TP change to fix
    offers_fixes=_varies,
    price=lambda pricer, compositions: {"pin_tp": (
        None, "no compute cost here: a deployment choice (one TP size for every server the suite meets; a model "
              "that needs more ranks than a machine has cannot take it)")},
)
