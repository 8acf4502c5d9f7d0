"""The diff as one JSON object (`flakecheck diff --json`): every case with its class and reasons, the score
change with its interval, the one-run diff, notes and the gate. Missing values are null, never NaN."""

from __future__ import annotations

import json
from typing import Any

from flakecheck.diff.result import DiffResult
from flakecheck.diff.side import Side


def diff_dict(result: DiffResult) -> dict[str, Any]:
    return {
        "a": _side(result.a),
        "b": _side(result.b),
        "paired_by": result.pairing.by,
        "counts": result.counts,
        "noise": result.noise_line(),
        "score": result.score.to_dict(),
        "one_run_diff": {"changed": len(result.raw_changed), "by_class": result.raw_counts,
                         "sentence": result.raw_sentence()},
        "cases": [{"case_id": c.case_id, "case_id_b": c.case_id_b, "class": c.kind, "why": c.why,
                   "flaky_on": c.flaky_on or None,
                   "passed_a": c.passed_a, "graded_a": c.graded_a, "pass_rate_a": c.pass_rate_a,
                   "passed_b": c.passed_b, "graded_b": c.graded_b, "pass_rate_b": c.pass_rate_b,
                   "reference_a": c.reference_a, "reference_b": c.reference_b, "one_run_changed": c.raw_changed,
                   "answers_a": c.answers_a, "answers_b": c.answers_b, "shared_answers": c.shared_answers,
                   "text_a": c.text_a, "text_b": c.text_b}
                  for c in result.cases],
        "notes": list(result.notes),
        "gate": {"passed": result.passed, "failures": list(result.failures),
                 "max_regressions": result.gate.max_regressions, "max_score_drop_pp": result.gate.max_score_drop},
    }


def _side(side: Side) -> dict[str, Any]:
    record = side.record
    return {"run_dir": str(side.path), "suite": record.suite, "suite_name": record.suite_name,
            "suite_sha256": record.suite_sha256, "model": record.model, "dtype": record.dtype,
            "policy": record.computer.policy, "source": record.source, "reference": side.reference,
            "compositions": list(side.labels), "draws": list(side.draws), "n_cases": len(side.case_ids)}


def render_diff_json(result: DiffResult) -> str:
    return json.dumps(diff_dict(result), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
