"""One case of A against the same case of B, judged against each side's own batch-composition spread.

Every composition (and repeat, and draw) a side was replayed under gives that side a verdict and an answer.
Over every pairing of a composition of A with a composition of B:

- `regression`: A passes under every composition of A and B fails under every composition of B (every
  pairing shows pass -> fail);
- `improvement`: the reverse (every pairing shows fail -> pass);
- `noise`: some pairing shows the verdicts differ, but at least one side's own compositions already disagree
  (its pass rate is strictly between 0 and 1), so another pairing shows them equal: whether a rerun sees a
  change depends on the batch compositions it lands in. A case stable on one side and verdict-flaky on the
  other is noise too, and its reason says which side flips;
- `same`: every pairing shows the same verdict (both always pass or both always fail; or neither side has
  a verdict) and some answer of B is one A gave under some composition;
- `changed-text`: the verdicts are the same under every pairing, but no answer of B is one A gave under any
  composition: the answers differ beyond what either side's compositions produce.

A case graded on one side only is judged by its answers alone (same or changed-text), and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CLASSES = ("regression", "improvement", "noise", "changed-text", "same")


@dataclass(frozen=True)
class CaseDiff:
    case_id: str  # A's id (the pair's key)
    case_id_b: str  # B's (differs from A's when cases are paired by position)
    kind: str  # one of CLASSES
    why: str
    passed_a: int  # compositions of A under which the case passes ...
    graded_a: int  # ... of those with a verdict
    passed_b: int
    graded_b: int
    reference_a: bool | None  # the verdict under each side's reference composition: the raw, one-run diff
    reference_b: bool | None
    answers_a: int  # distinct answers over the side's compositions
    answers_b: int
    shared_answers: int  # distinct answers both sides gave
    text_a: str  # the reference composition's answer
    text_b: str
    flaky_on: str = ""  # whose own compositions disagree on the verdict: "A", "B", "both" or ""

    @property
    def pass_rate_a(self) -> float | None:
        return self.passed_a / self.graded_a if self.graded_a else None

    @property
    def pass_rate_b(self) -> float | None:
        return self.passed_b / self.graded_b if self.graded_b else None

    @property
    def raw_changed(self) -> bool:
        """The one-run diff (reference against reference) shows a changed verdict."""
        return None not in (self.reference_a, self.reference_b) and self.reference_a != self.reference_b

    @property
    def label(self) -> str:
        return self.case_id if self.case_id == self.case_id_b else f"{self.case_id} ↔ {self.case_id_b}"


def classify(case_id: str, case_id_b: str, verdicts_a: Mapping[str, bool | None],
             verdicts_b: Mapping[str, bool | None], texts_a: Mapping[str, str], texts_b: Mapping[str, str],
             reference_a: str, reference_b: str) -> CaseDiff:
    """`verdicts_*`, `texts_*`: label -> the side's verdict and answer; `reference_*`: each side's reference label."""
    va = [v for v in verdicts_a.values() if v is not None]
    vb = [v for v in verdicts_b.values() if v is not None]
    answers_a, answers_b = set(texts_a.values()), set(texts_b.values())
    shared = answers_a & answers_b
    kind, why = _judge(va, vb, len(answers_a), len(answers_b), len(shared))
    flaky = [name for name, vs in (("A", va), ("B", vb)) if len(set(vs)) > 1]
    return CaseDiff(case_id, case_id_b, kind, why, sum(va), len(va), sum(vb), len(vb),
                    verdicts_a.get(reference_a), verdicts_b.get(reference_b), len(answers_a), len(answers_b),
                    len(shared), texts_a.get(reference_a, ""), texts_b.get(reference_b, ""),
                    "both" if len(flaky) == 2 else "".join(flaky))


def _judge(va: list[bool], vb: list[bool], n_a: int, n_b: int, n_shared: int) -> tuple[str, str]:
    if va and vb:
        rates = f"A passes under {_of(va)} compositions, B under {_of(vb)}"
        if all(va) and not any(vb):
            return "regression", f"{rates}: B fails wherever A passes"
        if not any(va) and all(vb):
            return "improvement", f"{rates}: B passes wherever A fails"
        if len(set(va)) > 1 or len(set(vb)) > 1:
            split = [name for name, vs in (("A", va), ("B", vb)) if len(set(vs)) > 1]
            whose = "both sides' own compositions disagree" if len(split) == 2 else \
                f"{split[0]}'s own compositions already disagree"
            return "noise", f"{rates}: {whose}, so whether a rerun sees a change depends on batch composition"
        agreed = f"{'pass' if va[0] else 'fail'} under every composition ({len(va)} of A, {len(vb)} of B)"
    elif va or vb:
        agreed = f"graded on {'A' if va else 'B'} only"
    else:
        agreed = "no verdict on either side"
    if n_shared:
        return "same", f"{agreed}; {n_shared} answer(s) appear on both sides"
    return "changed-text", (f"{agreed}, but none of B's {n_b} distinct answer(s) is one of A's {n_a}: the text "
                            "changed beyond what either side's compositions produce")


def _of(verdicts: list[bool]) -> str:
    return f"{sum(verdicts)} of {len(verdicts)}"
