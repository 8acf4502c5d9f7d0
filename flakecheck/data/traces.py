"""A trace: what one case generated under one (composition, repeat), with the evidence per token.

Traces are what every source of generations hands to the analysis — the built-in engine's replay,
a probe of a server — and what a run directory keeps under partial/ while a run is in progress.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VerdictKey = tuple[str, str, int]  # (case_id, composition, repeat)


def run_label(composition: str, repeat: int) -> str:
    """How a (composition, repeat) is named in tables and reports: `batch8`, `batch8 #1`."""
    return composition if repeat == 0 else f"{composition} #{repeat}"


@dataclass(frozen=True)
class Trace:
    case_id: str
    composition: str
    repeat: int
    token_ids: list[int]
    top1_ids: list[int]
    top1_logprobs: list[float]
    top2_ids: list[int]
    top2_logprobs: list[float]
    finish_reason: str
    # the chosen token's raw logit in the model dtype, per step (None where the source does not
    # report logits, e.g. a server probe): it sizes one ulp of the logits for tie classification
    top1_logits: list[float] | None = None
    # a mixture of experts' routing per step (None for a dense model, or a server that returns none;
    # flakecheck.data.routing): the smallest k-th/(k+1)-th router gap over the layers and its layer (None
    # where a server returns the experts but not the scores), and a digest of the experts every layer chose
    routing_margins: list[float | None] | None = None
    routing_layers: list[int | None] | None = None
    routing_digests: list[int] | None = None

    @classmethod
    def from_record(cls, row: dict[str, Any]) -> Trace:
        """A trace from a parquet row (numpy arrays and numpy scalars become lists and Python numbers)."""
        logits = row.get("top1_logits")
        margins, layers, digests = (row.get(k) for k in ("routing_margins", "routing_layers", "routing_digests"))
        return cls(
            str(row["case_id"]), str(row["composition"]), int(row["repeat"]),
            [int(x) for x in row["token_ids"]], [int(x) for x in row["top1_ids"]],
            [float(x) for x in row["top1_logprobs"]], [int(x) for x in row["top2_ids"]],
            [float(x) for x in row["top2_logprobs"]], str(row["finish_reason"]),
            None if logits is None else [float(x) for x in logits],
            None if margins is None else [None if x is None else float(x) for x in margins],
            None if layers is None else [None if x is None else int(x) for x in layers],
            None if digests is None else [int(x) for x in digests],
        )


def traces_digest(traces: Iterable[Trace]) -> str:
    """A digest of every token id, top-2 id and logprob of a run's traces, in a fixed order: two runs with
    equal digests computed the same bits (whatever machine, replay or cluster computed them); a mixture of
    experts' routing (its margins and experts) too, where the traces carry it."""
    digest = hashlib.sha256()
    for t in sorted(traces, key=lambda t: (t.case_id, t.composition, t.repeat)):
        fields: list = [t.case_id, t.composition, t.repeat, t.token_ids, t.top1_ids, t.top2_ids,
                        [float(x).hex() for x in t.top1_logprobs], [float(x).hex() for x in t.top2_logprobs]]
        if t.routing_digests is not None:
            fields += [t.routing_digests, [None if x is None else float(x).hex() for x in t.routing_margins or []]]
        digest.update(json.dumps(fields).encode())
    return digest.hexdigest()[:32]
