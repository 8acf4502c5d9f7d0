"""Verdicts for every trace, before analysis: the suite's own checks (flakecheck.grading.checks), or an external
grader process (flakecheck.grading.external) when one is given, which then replaces the checks.

Each distinct output text of a case is graded once (most compositions reproduce the reference, and a
regex check may take its full time bound or a grader may execute code); every trace with that text
shares the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace, VerdictKey, run_label
from flakecheck.grading.checks import grade
from flakecheck.grading.external import GradeRequest, GraderError, GraderSpec, run_grader


def grade_traces(traces: Sequence[Trace], cases: Sequence[Case], decode: Callable[[list[int]], str],
                 grader: GraderSpec | None = None) -> dict[VerdictKey, bool | None]:
    """pass/fail (None: nothing to grade against) for every trace, by (case_id, composition, repeat)."""
    by_id = {case.id: case for case in cases}
    groups: dict[tuple[str, str], list[Trace]] = {}  # (case_id, text) -> the traces that produced it
    texts: dict[tuple[str, tuple[int, ...]], str] = {}
    for trace in traces:
        key = (trace.case_id, tuple(trace.token_ids))
        if key not in texts:
            texts[key] = decode(list(trace.token_ids))
        groups.setdefault((trace.case_id, texts[key]), []).append(trace)
    if grader is None:
        graded = {key: grade(key[1], by_id[key[0]].checks, by_id[key[0]].targets) for key in groups}
    else:
        graded = _external(groups, by_id, grader)
    return {(t.case_id, t.composition, t.repeat): graded[key] for key, group in groups.items() for t in group}


def grade_run(traces: Sequence[Trace], cases: Sequence[Case], decode: Callable[[list[int]], str],
              grader: GraderSpec | None, kept: Path, resume_command: str) -> dict[VerdictKey, bool | None]:
    """grade_traces for `flakecheck run`: a grader failure says where the generated outputs are kept and
    the command that grades them again without replaying."""
    try:
        return grade_traces(traces, cases, decode, grader)
    except GraderError as exc:
        raise GraderError(f"{exc}\nThe generated outputs are kept in {kept}; fix the grader, then grade them "
                          f"without replaying: {resume_command}") from None


def memo_decode(decode: Callable[[list[int]], str]) -> Callable[[list[int]], str]:
    """`decode` computed once per distinct token sequence (grading and analysis both need the texts)."""
    texts: dict[tuple[int, ...], str] = {}

    def cached(ids: list[int]) -> str:
        key = tuple(ids)
        if key not in texts:
            texts[key] = decode(list(ids))
        return texts[key]

    return cached


def _external(groups: dict[tuple[str, str], list[Trace]], by_id: dict[str, Case],
              grader: GraderSpec) -> dict[tuple[str, str], bool | None]:
    requests, asked = [], {}
    for (case_id, text), group in groups.items():
        case, first = by_id[case_id], group[0]
        request = GradeRequest(case_id, run_label(first.composition, first.repeat), text, _target(case),
                               case.metadata)
        requests.append(request)
        asked[(request.case_id, request.composition)] = (case_id, text)
    answers = run_grader(grader, requests)
    return {asked[key]: passed for key, passed in answers.items()}


def _target(case: Case) -> str | list[str] | None:
    """The target as the suite gave it: one string, a list of several, or null."""
    if not case.targets:
        return None
    return case.targets[0] if len(case.targets) == 1 else list(case.targets)
