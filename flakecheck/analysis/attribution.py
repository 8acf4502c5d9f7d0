"""Mechanism names and the per-case verdict read from attribution rows (pure; the reports use it too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flakecheck.data.compositions import AXES

# (mechanism, op class, label): reductions, replayed with only that op class split
REDUCTIONS = (("matmul_splitk", "matmul", "matmul split-K"),
              ("attention_splitkv", "attention", "attention split-KV"),
              ("norm_splits", "norm", "norm/softmax row splits"))
# (mechanism, op class, label): a mixture of experts' two kinds of matmul, each replayed split alone (every other
# matmul fixed-order): the router's (a routing flip) and the routed experts' per-expert split plans
MOE_REDUCTIONS = (("router_splitk", "router", "router matmul split-K"),
                  ("experts_splitk", "experts", "expert matmuls split-K"))
# (mechanism, label): scheduling features, replayed with that feature removed: the batch size (the core of every
# composition), and each composition axis (flakecheck/data/axes/) — those that change the reductions themselves
# (a TP size) last
BATCH_SIZE = ("batch_size", "batch size")
SCHEDULING = (tuple((a.name, a.label) for a in AXES if not a.changes_reductions) + (BATCH_SIZE,)
              + tuple((a.name, a.label) for a in AXES if a.changes_reductions))
LABELS = {m: label for m, _, label in REDUCTIONS + MOE_REDUCTIONS} | dict(SCHEDULING)
MECHANISMS = tuple(LABELS)
INTERACTION = "interaction"


def case_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One case's attribution rows -> which mechanisms alone reproduce its divergence: their labels joined by
    ' + ', or 'interaction' when no candidate alone does (the flip needs several at once); per axis (None:
    no candidate on that axis) and overall."""

    def axis(kind: str | None) -> str | None:
        mine = [r for r in rows if kind is None or r["kind"] == kind]
        if not any(r["candidate"] for r in mine):
            return None
        alone = [LABELS.get(str(r["mechanism"]), str(r["mechanism"])) for r in mine if r["reproduces"]]
        return " + ".join(alone) if alone else INTERACTION

    return {"summary": axis(None) or INTERACTION, "reduction": axis("reduction"), "scheduling": axis("scheduling"),
            "mechanisms": [str(r["mechanism"]) for r in rows if r["reproduces"]]}
