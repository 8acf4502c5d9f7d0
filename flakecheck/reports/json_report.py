"""The JSON report (`flakecheck report --format json`): one object a script can consume.

Missing values are null (never NaN), so any JSON parser reads it.
"""

from __future__ import annotations

import json
from typing import Any

from flakecheck.reports.facts import empty_answer_warning, gather, next_command
from flakecheck.score_swing import swing_sentence
from flakecheck.rundir import RunData


def report_dict(run: RunData, top: int = 10) -> dict[str, Any]:
    facts = gather(run)
    why, command = next_command(facts)
    return {
        "run_dir": str(facts.path),
        "suite": facts.meta.get("suite"),
        "suite_name": facts.suite_name,
        "suite_sha256": facts.meta.get("suite_sha256"),
        "model": facts.model,
        "dtype": facts.dtype,
        "policy": facts.policy,
        "backend": facts.backend,
        "profile": facts.profile,
        "reference": facts.reference,
        "thresholds": {"gap_threshold": facts.gap_threshold, "gap_window": facts.gap_window},
        "n_cases": facts.n_cases,
        "counts": facts.counts,
        "flaky_rate": facts.flaky_rate,
        "verdict_flips": facts.verdict_flips,
        "empty_answers": {"count": len(facts.empty_answers), "case_ids": facts.empty_answers,
                          "warning": empty_answer_warning(facts)},
        "input_format": facts.meta.get("input_format"),
        "score": {**facts.score.to_dict(), "sentence": swing_sentence(facts.score)},
        "flips": {"counts": facts.flip_counts, "confident": facts.confident_flips},
        "grader": facts.meta.get("grader"),
        "compositions": [
            {"name": c.name, "reference": c.is_reference, "diverged_cases": c.diverged_cases,
             "verdict_changes": c.verdict_changes, "score": facts.score.per_composition.get(c.name)}
            for c in facts.compositions
        ],
        "top": facts.top(top),
        "next": {"why": why, "command": command},
    }


def render_json(run: RunData, top: int = 10) -> str:
    return json.dumps(report_dict(run, top), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
