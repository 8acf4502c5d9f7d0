"""One side of a comparison: a run directory's verdicts and answers per case and run label (every composition
and repeat it was replayed under, draws included), read through the run directory's own readers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flakecheck.data.record import RunRecord
from flakecheck.data.rundir import RunData
from flakecheck.data.traces import run_label
from flakecheck.reports.facts import clean, gather


@dataclass(frozen=True)
class Side:
    path: Path
    record: RunRecord
    case_ids: tuple[str, ...]  # in suite order
    labels: tuple[str, ...]  # every (composition, repeat) in replay order
    reference: str  # the reference composition's label (its first repeat)
    draws: tuple[str, ...]  # the labels that are draws from a load (a run with --sample, a probe's levels)
    verdicts: dict[str, dict[str, bool | None]]  # case id -> label -> passed (None: ungraded)
    texts: dict[str, dict[str, str]]  # case id -> label -> the answer

    @property
    def name(self) -> str:
        return str(self.path)


def side_of(run: RunData) -> Side:
    facts = gather(run)
    record = facts.record
    texts: dict[str, dict[str, str]] = {}
    for case_id, composition, repeat, text in zip(run.runs["case_id"], run.runs["composition"], run.runs["repeat"],
                                                  run.runs["text"]):
        texts.setdefault(str(case_id), {})[run_label(str(composition), int(repeat))] = str(clean(text) or "")
    draws = set(record.draws)
    labels = tuple(facts.run_labels)
    return Side(run.path, record, case_order(run), labels, run_label(record.reference, 0),
                tuple(label for label in labels if label.split(" #")[0] in draws), facts.verdicts, texts)


def case_order(run: RunData) -> tuple[str, ...]:
    """The cases in the suite's order, as the record lists them (a record without its case list: the table's)."""
    listed = [str(c["case_id"]) for c in run.record.cases if c.get("case_id") is not None]
    present = {str(i) for i in run.cases["case_id"]}
    if listed and set(listed) == present:
        return tuple(listed)
    return tuple(str(i) for i in run.cases["case_id"])
