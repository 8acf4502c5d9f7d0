"""The whole comparison of two run directories: pair the cases, classify each, measure the score change,
apply the gate."""

from __future__ import annotations

from pathlib import Path

from flakecheck.data.rundir import RunData, load_run
from flakecheck.diff.classify import classify
from flakecheck.diff.gate import gate_failures
from flakecheck.diff.pairing import pair_cases
from flakecheck.diff.result import DiffGate, DiffResult
from flakecheck.diff.score import score_change
from flakecheck.diff.side import Side, side_of


def diff_runs(run_a: RunData | str | Path, run_b: RunData | str | Path, gate: DiffGate = DiffGate()) -> DiffResult:
    """A (before) against B (after): run directories, loaded or by path."""
    a, b = (side_of(r if isinstance(r, RunData) else load_run(r)) for r in (run_a, run_b))
    pairing = pair_cases(a.case_ids, b.case_ids, a.name, b.name)
    cases = [classify(ia, ib, a.verdicts.get(ia, {}), b.verdicts.get(ib, {}), a.texts.get(ia, {}),
                      b.texts.get(ib, {}), a.reference, b.reference) for ia, ib in pairing.pairs]
    n_regressions = sum(c.kind == "regression" for c in cases)
    n_improvements = sum(c.kind == "improvement" for c in cases)
    score = score_change(pairing.pairs, a.verdicts, b.verdicts, a.labels, b.labels, a.draws, b.draws, a.reference,
                         b.reference, n_regressions, n_improvements)
    notes = (*pairing.warnings, *_notes(a, b))
    return DiffResult(a, b, pairing, tuple(cases), score, gate, gate_failures(gate, cases, score), notes)


def _notes(a: Side, b: Side) -> list[str]:
    notes = []
    for name, side in (("A", a), ("B", b)):
        if len(side.labels) < 2:
            notes.append(f"{name} was replayed under one composition only: its own spread is unknown, so no case "
                         f"is noise on its side")
        elif side.record.source == "engine" and not side.record.computer.varies:
            notes.append(f"{name} ran fixed-order kernels ({side.record.computer.policy}): its compositions give "
                         "the same bits, so it shows no batch noise; run it with --kernels splitk to measure it")
    names_a, names_b = a.record.composition_names, b.record.composition_names
    if names_a != names_b:
        notes.append(f"the sides were replayed under different compositions (A: {_names(names_a)}; B: "
                     f"{_names(names_b)}): each side's own spread is used as it is")
    if bool(a.draws) != bool(b.draws):
        notes.append("only one side has draws from a load: the interval pairs the named compositions")
    return notes


def _names(names: list[str], shown: int = 8) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
