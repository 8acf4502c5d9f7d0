"""The facts every report shows, computed once from a run directory (no model needed).

Terminal, markdown, JSON, HTML and the gate all read these, so they never disagree about a count.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flakecheck.analysis.flip_kind import FLIP_KINDS
from flakecheck.analysis.score_swing import ScoreSwing, score_swing
from flakecheck.data.record import Computer, RunRecord
from flakecheck.data.rundir import CASES_SCHEMA, STATUSES, RunData
from flakecheck.data.traces import run_label
from flakecheck.reports.flip_view import FlipView

DIVERGED = ("flaky", "verdict_flaky")
# The summary warns about empty answers when at least this share of the cases (and at least one) has an empty
# reference answer: an instruct model sent a question without its chat template often ends its turn at once.
EMPTY_ANSWER_WARN_SHARE = 0.10


def clean(value: Any) -> Any:
    """A parquet cell as plain Python: NaN/NA/None -> None, numpy scalars -> int/float/bool, and a list cell
    (a numpy array from pyarrow) -> a list of those, whatever its length: a one-token output stays a list."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain values; column-wise, as DataFrame.to_dict is slow on many small frames."""
    columns = {name: [clean(v) for v in frame[name].tolist()] for name in frame.columns}
    return [dict(zip(columns, row)) for row in zip(*columns.values())]


def case_records(cases: pd.DataFrame) -> list[dict[str, Any]]:
    """cases.parquet as plain dicts, most likely to flip first (flip_order). A column an older run directory
    lacks (flip_kind, p_flip) reads as None, so its reports still render."""
    records_ = records(cases)
    for record in records_:
        for name in CASES_SCHEMA.names:
            record.setdefault(name, None)
    return sorted(records_, key=flip_order)


def flip_order(case: dict[str, Any]) -> tuple[float, float, float, str]:
    """By observed flip probability (a run with draws), then predicted, then the old risk score (a run
    directory from before predictions), then case id so that the order is stable."""
    def descending(value: Any) -> float:
        return -value if value is not None else 1.0  # a missing value after every present one

    return (descending(case.get("p_flip")), descending(case.get("p_flip_pred")), -(case.get("risk") or 0.0),
            str(case["case_id"]))


@dataclass
class CompositionFacts:
    name: str
    is_reference: bool
    diverged_cases: int
    verdict_changes: int
    tp: int = 1  # tensor-parallel ranks, as the run recorded the composition
    allreduce: str = "auto"


@dataclass
class RunFacts:
    path: Path
    suite_name: str
    model: str
    dtype: str
    engine: Computer  # what computed the traces: the engine's policy on a backend, or a server
    reference: str
    gap_threshold: float
    gap_window: int
    n_cases: int
    counts: dict[str, int]
    verdict_flips: list[str]
    cases: list[dict[str, Any]]
    compositions: list[CompositionFacts]
    command: str | None
    record: RunRecord = field(repr=False)
    empty_answers: list[str] = field(default_factory=list)  # cases whose reference answer is empty or blank
    verdicts: dict[str, dict[str, bool | None]] = field(default_factory=dict)  # case -> run label -> passed
    run_labels: list[str] = field(default_factory=list)  # every (composition, repeat), in replay order
    # diverged cases that diverge only under compositions of another TP size than the reference's
    tp_only_flips: list[str] = field(default_factory=list)
    # a mixture of experts: cases whose chosen experts differ from the reference's under some composition
    rerouted: list[str] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.engine.policy

    @property
    def backend(self) -> str:
        return self.engine.backend

    @property
    def profile(self) -> str:
        return self.engine.profile

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def runs_on(self) -> str:
        """"torch on cpu", "triton on cuda:0"; a server's endpoint as it is."""
        return self.backend if self.device == "server" else f"{self.backend} on {self.device}"

    @property
    def score(self) -> ScoreSwing:
        return score_swing(self.verdicts, self.run_labels, self.swing_cause)

    @property
    def swing_cause(self) -> str:
        return "batch composition and TP size" if self.tensor_parallel else "batch composition"

    @property
    def flip(self) -> FlipView | None:
        """Flip probability over the run's draws (None without draws)."""
        return FlipView.of(self.record.flip, self.cases)

    @property
    def flip_counts(self) -> dict[str, int]:
        """Diverged cases by the kind of their first flip (tie, near_tie, confident)."""
        counts = {kind: 0 for kind in FLIP_KINDS}
        for c in self.cases:
            if c.get("flip_kind") in counts:
                counts[c["flip_kind"]] += 1
        return counts

    @property
    def confident_flips(self) -> list[str]:
        return [str(c["case_id"]) for c in self.cases if c.get("flip_kind") == "confident"]

    @property
    def n_diverged(self) -> int:
        return sum(self.counts[s] for s in DIVERGED)

    @property
    def flaky_rate(self) -> float:
        return self.n_diverged / self.n_cases if self.n_cases else 0.0

    @property
    def composition_names(self) -> list[str]:
        return [c.name for c in self.compositions]

    @property
    def tensor_parallel(self) -> bool:
        """Whether any composition runs at another TP size than one."""
        return any(c.tp != 1 for c in self.compositions)

    def composition_label(self, c: CompositionFacts) -> str:
        """The name, with its TP size and all-reduce where a composition of the run is tensor-parallel."""
        if not self.tensor_parallel:
            return c.name
        return f"{c.name} (tp {c.tp}{', ' + c.allreduce if c.tp > 1 else ''})"

    def top(self, n: int) -> list[dict[str, Any]]:
        """The n cases most likely to flip that are not stable (a stable case has nothing to show)."""
        return [c for c in self.cases if c["status"] != "stable"][:max(n, 0)]


def gather(run: RunData) -> RunFacts:
    record = run.record
    cases = case_records(run.cases)
    counts = {s: 0 for s in STATUSES}
    for c in cases:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    names = record.composition_names
    compositions = _composition_facts(run.runs, names, record.reference, record.compositions)
    return RunFacts(
        path=run.path,
        suite_name=record.suite_name,
        model=record.model,
        dtype=record.dtype or "?",
        engine=record.computer,
        reference=record.reference,
        gap_threshold=record.gap_threshold,
        gap_window=record.gap_window,
        n_cases=len(cases),
        counts=counts,
        verdict_flips=[c["case_id"] for c in cases if c["verdict_flip"]],
        cases=cases,
        compositions=compositions,
        command=record.command,
        record=record,
        empty_answers=_empty_answers(run.runs, record.reference),
        **_verdicts(run.runs, names),
        tp_only_flips=_tp_only_flips(run.runs, compositions),
        rerouted=_rerouted(run.runs),
    )


def _rerouted(runs: pd.DataFrame) -> list[str]:
    """Cases some run of which chose other experts than the reference's (none in a dense run, or one written
    before routing was recorded)."""
    if "routing_divergence" not in runs.columns:
        return []
    return sorted({str(c) for c, step in zip(runs["case_id"], runs["routing_divergence"]) if clean(step) is not None})


def _verdicts(runs: pd.DataFrame, names: list[str]) -> dict[str, Any]:
    """Every case's verdict per run label, and the labels in replay order (composition order, then repeat)."""
    order = {name: i for i, name in enumerate(names)}
    keys = sorted({(int(r), str(c)) for c, r in zip(runs["composition"], runs["repeat"])},
                  key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))
    verdicts: dict[str, dict[str, bool | None]] = {}
    for case_id, composition, repeat, passed in zip(runs["case_id"], runs["composition"], runs["repeat"],
                                                    runs["passed"]):
        verdicts.setdefault(str(case_id), {})[run_label(str(composition), int(repeat))] = clean(passed)
    return {"verdicts": verdicts, "run_labels": [run_label(c, r) for r, c in keys]}


def _empty_answers(runs: pd.DataFrame, reference: str) -> list[str]:
    ref = runs[(runs["composition"] == reference) & (runs["repeat"] == 0)]
    return sorted(str(case_id) for case_id, text in zip(ref["case_id"], ref["text"])
                  if not str(clean(text) or "").strip())


def empty_answer_warning(facts: RunFacts) -> str | None:
    """'12 of 40 cases produced an empty answer — is the input format right?' when at least
    EMPTY_ANSWER_WARN_SHARE of the cases (and at least one) have an empty reference answer, else None."""
    n = len(facts.empty_answers)
    if not n or n < EMPTY_ANSWER_WARN_SHARE * facts.n_cases:
        return None
    text = f"{n} of {facts.n_cases} cases produced an empty answer — is the input format right?"
    applied = facts.record.details.get("input_format")
    if isinstance(applied, dict) and applied.get("raw") and applied.get("chat_template"):
        text += (f" ({applied['raw']} case(s) were sent as raw text; a 'prompt' is always raw, and "
                 "--input-format chat sends every string as a user message)")
    return text


def _tp_only_flips(runs: pd.DataFrame, compositions: list[CompositionFacts]) -> list[str]:
    """Cases that diverge from the reference, and only under compositions at another TP size than its own:
    the TP change (its all-reduce, its shards' split-K) flips them, nothing a batch does at the reference's."""
    reference_tp = next((c.tp for c in compositions if c.is_reference), 1)
    other_tp = {c.name for c in compositions if c.tp != reference_tp}
    if not other_tp:
        return []
    diverged = runs[runs["first_divergence"].notna()]
    by_case: dict[str, set[str]] = {}
    for case_id, name in zip(diverged["case_id"], diverged["composition"]):
        by_case.setdefault(str(case_id), set()).add(str(name))
    return sorted(case for case, names in by_case.items() if names <= other_tp)


def _composition_facts(runs: pd.DataFrame, names: list[str], reference: str,
                       recorded: tuple[dict[str, Any], ...] = ()) -> list[CompositionFacts]:
    """Per composition: cases whose output diverged from the reference, whose verdict changed, and its TP size
    and all-reduce as recorded (a run without them: one rank)."""
    by_name = {str(c.get("name")): c for c in recorded}
    ref = runs[(runs["composition"] == reference)].sort_values("repeat").drop_duplicates("case_id")
    ref_passed = dict(zip(ref["case_id"], ref["passed"].map(clean)))
    facts = []
    for name in names:
        rows = runs[runs["composition"] == name]
        diverged = rows[rows["first_divergence"].notna()]["case_id"].nunique()
        changed = {
            case_id for case_id, passed in zip(rows["case_id"], rows["passed"].map(clean))
            if passed is not None and ref_passed.get(case_id) is not None and passed != ref_passed[case_id]
        }
        tp = by_name.get(name, {})
        facts.append(CompositionFacts(name, name == reference, int(diverged), len(changed), int(tp.get("tp") or 1),
                                      str(tp.get("allreduce") or "auto")))
    return facts


def next_command(facts: RunFacts) -> tuple[str, str]:
    """(why, command): under splitk with divergences, rerun invariant to confirm the fix; else gate it."""
    tp_fixable = bool(facts.tp_only_flips) and facts.policy != "tp-invariant"  # fixed order does not hold them
    if (facts.engine.varies or tp_fixable) and facts.n_diverged:
        kernels = "tp-invariant kernels (its TP sizes differ)" if facts.tensor_parallel else "fixed-order kernels"
        return (f"confirm the fix: the same run with {kernels} should make every case stable",
                invariant_rerun(facts))
    return ("gate it in CI", f"flakecheck gate {shlex.quote(str(facts.path))}")


def invariant_rerun(facts: RunFacts) -> str:
    """The run's own settings with fixed-order kernels, into a new run directory, as the run recorded it (a run
    directory from before it was recorded: the suite alone with fixed-order kernels)."""
    return facts.record.fixed_order_command or shlex.join(["flakecheck", "run", facts.record.suite, "--kernels",
                                                           "invariant"])


def prompt_text(case_input: Any) -> str:
    """A case's input as plain text: a raw prompt, or chat messages as 'role: content' lines."""
    if isinstance(case_input, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in case_input)
    return "" if case_input is None else str(case_input)


def suite_cases(record: RunRecord) -> dict[str, dict[str, Any]]:
    """The record's cases by case id: prompts, targets, checks and metadata without the suite file."""
    return {str(c.get("case_id")): c for c in record.cases}


def fmt_gap(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def fmt_step(value: int | float | None) -> str:
    return "—" if value is None else str(int(value))


def fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def score_range(score: ScoreSwing) -> str | None:
    """'58% (batch32) – 64% (solo)': the lowest and highest per-composition score, or None without grades."""
    low, high = score.low, score.high
    if low is None or high is None:
        return None
    if low[1] == high[1]:
        return f"{fmt_rate(low[1])} under every composition"
    return f"{fmt_rate(low[1])} ({low[0]}) – {fmt_rate(high[1])} ({high[0]})"


def flip_summary(facts: RunFacts) -> str | None:
    """'first flips: 30 tie · 20 near_tie · 4 confident' over the diverged cases (a mixture of experts' run: and
    '· 3 routing', with how many cases chose other experts somewhere), or None when none diverged."""
    counts = facts.flip_counts
    if not sum(counts.values()):
        return None
    routed = counts["routing"] or facts.rerouted
    line = "first flips: " + " · ".join(f"{counts[k]} {k}" for k in FLIP_KINDS if k != "routing" or routed)
    noise = facts.record.gap_noise
    if noise:
        line += f" (before diverging, batch composition moved a top-1/top-2 gap by up to {noise:.3f})"
    if routed:
        line += (f"; the router chose other experts in {len(facts.rerouted)} of {facts.n_cases} cases (a routing "
                 "flip: other experts at or before the first divergence, and an ordinary top-1/top-2 gap)")
    return line


CONFIDENT_NOTE = ("a gap above the near-tie threshold and above every gap shift measured before a divergence flipped: "
                  "batch-order rounding did not move logits that far anywhere else in this run, so look for a bug "
                  "or a larger numeric difference (dtype, quantisation, another build)")
TP_ONLY_NOTE = ("they diverge only where the tensor-parallel size differs from the reference's: the all-reduce's "
                "order (and each shard's GEMM) changed their logits; fixed-order kernels do not hold them, a pinned "
                "TP size or --kernels tp-invariant does")
