"""The JSON report (`flakecheck report --format json`): one object a script can consume.

Missing values are null (never NaN), so any JSON parser reads it.
"""

from __future__ import annotations

import json
from typing import Any

from flakecheck.analysis.score_swing import swing_sentence
from flakecheck.data.rundir import RunData
from flakecheck.reports.explanation import Explanation, explanation
from flakecheck.reports.facts import empty_answer_warning, gather, next_command


def report_dict(run: RunData, top: int = 10) -> dict[str, Any]:
    facts = gather(run)
    why, command = next_command(facts)
    return {
        "run_dir": str(facts.path),
        "suite": facts.record.suite,
        "suite_name": facts.suite_name,
        "suite_sha256": facts.record.suite_sha256,
        "model": facts.model,
        "dtype": facts.dtype,
        "policy": facts.policy,
        "backend": facts.backend,
        "profile": facts.profile,
        "device": facts.device,
        "machine": facts.engine.machine,
        "verified": facts.engine.verified,
        "reference": facts.reference,
        "thresholds": {"gap_threshold": facts.gap_threshold, "gap_window": facts.gap_window},
        "n_cases": facts.n_cases,
        "counts": facts.counts,
        "flaky_rate": facts.flaky_rate,
        "verdict_flips": facts.verdict_flips,
        "empty_answers": {"count": len(facts.empty_answers), "case_ids": facts.empty_answers,
                          "warning": empty_answer_warning(facts)},
        "input_format": facts.record.details.get("input_format"),
        "score": {**facts.score.to_dict(), "sentence": swing_sentence(facts.score)},
        "flips": {"counts": facts.flip_counts, "confident": facts.confident_flips, "tp_only": facts.tp_only_flips},
        # flip probability over the draws: how they were drawn, agreement, the score under load, calibration
        "flip_probability": facts.record.flip,
        "grader": facts.record.details.get("grader"),
        "compositions": [
            {"name": c.name, "reference": c.is_reference, "tp": c.tp, "allreduce": c.allreduce,
             "diverged_cases": c.diverged_cases,
             "verdict_changes": c.verdict_changes, "score": facts.score.per_composition.get(c.name)}
            for c in facts.compositions
        ],
        "top": facts.top(top),
        "explain": explain_dict(explanation(run)),
        "next": {"why": why, "command": command},
    }


def explain_dict(facts: Explanation | None) -> dict[str, Any] | None:
    """What `flakecheck explain` found (null when it has not run): per case, the mechanisms that alone reproduce
    its flip; per mechanism, in how many cases it was variable and reproduced; the ranked fixes."""
    if facts is None:
        return None
    info = facts.info
    return {
        "steps_after": facts.steps_after,
        "cases": [{"case_id": c.case_id, "first_divergence": c.step, "composition": c.where, "summary": c.summary,
                   "reduction": c.reduction, "scheduling": c.scheduling,
                   "mechanisms": [{k: r[k] for k in ("mechanism", "kind", "candidate", "reason", "side_a", "side_b",
                                                     "first_divergence", "same_step", "same_tokens", "token_a",
                                                     "token_b", "reproduces")} for r in c.rows]}
                  for c in facts.cases],
        "mechanisms": {m: {"candidate": facts.candidates[m], "reproduces": facts.reproduces[m]}
                       for m in facts.candidates},
        "interaction": facts.interactions,
        "fixes": facts.fixes,
        "timings": info.get("timings"),
        "replays": info.get("replays"),
    }


def render_json(run: RunData, top: int = 10) -> str:
    return json.dumps(report_dict(run, top), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
