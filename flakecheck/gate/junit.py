"""The gate's JUnit XML: one testcase per case, so CI test views list every case.

- `<failure>`: the case fails the gate (newly divergent, its verdict flips over the budget, ...);
- `<flakyFailure>`: it diverged but the gate tolerates it (Maven Surefire's element for a test that
  passed with flaky runs; readers that do not know it count the case as passed);
- `<skipped>`: quarantined;
- `<properties>`: status, the predicted flip probability (and the observed one, with draws), min_gap,
  first_divergence, the diverging tokens and the flip kind (tie, near_tie, confident), the runs passed of the
  runs graded and pass_k (every run passed: promptfoo's pass^k); on the suite, the score swing (worst-case,
  best-case score and the swing in points) and the --min-pass-rate when given.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from flakecheck.gate.result import CaseOutcome, GateResult

# XML 1.0 cannot carry most control characters, whatever the escaping; model output may contain them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
CASE_PROPERTIES = ("status", "p_flip_pred", "p_flip", "min_gap", "first_divergence", "divergence_composition",
                   "ref_token", "alt_token", "gap_at_divergence", "flip_kind", "n_near_ties", "pass_rate",
                   "verdict_flip")


def xml_text(value: Any) -> str:
    return _NOT_XML.sub("\ufffd", "" if value is None else str(value))


def junit_tree(result: GateResult) -> ET.ElementTree:
    facts = result.facts
    suite_name = f"flakecheck.{facts.suite_name}"
    counts = {k: len(result.with_outcome(k)) for k in ("fail", "quarantined")}
    root = ET.Element("testsuites", name="flakecheck", tests=str(len(result.outcomes)),
                      failures=str(counts["fail"]), errors="0", skipped=str(counts["quarantined"]))
    suite = ET.SubElement(root, "testsuite", name=xml_text(suite_name), tests=str(len(result.outcomes)),
                          failures=str(counts["fail"]), errors="0", skipped=str(counts["quarantined"]),
                          time="0", timestamp=xml_text(facts.record.created_at))
    props = ET.SubElement(suite, "properties")
    for name, value in (("model", facts.model), ("dtype", facts.dtype), ("policy", facts.policy),
                        ("backend", facts.backend), ("profile", facts.profile),
                        ("compositions", ",".join(facts.composition_names)), ("reference", facts.reference),
                        ("flaky_rate", f"{result.flaky_rate:.6f}"), ("gate", "passed" if result.passed else "failed"),
                        ("run_dir", str(facts.path)), *_score_properties(result),
                        *([("min_pass_rate", f"{result.settings.min_pass_rate:g}")]
                          if result.settings.min_pass_rate is not None else [])):
        ET.SubElement(props, "property", name=name, value=xml_text(value))
    for outcome in result.outcomes:
        suite.append(_testcase(outcome, suite_name))
    return ET.ElementTree(root)


def _score_properties(result: GateResult) -> list[tuple[str, str]]:
    score = result.score
    if not score.n_graded:
        return []
    return [("score_worst_case", f"{score.worst:.6f}"), ("score_best_case", f"{score.best:.6f}"),
            ("score_swing_pp", f"{score.swing_pp:.3f}")]


def _testcase(outcome: CaseOutcome, classname: str) -> ET.Element:
    case = outcome.case
    element = ET.Element("testcase", classname=xml_text(classname), name=xml_text(case["case_id"]), time="0")
    props = ET.SubElement(element, "properties")
    for name in CASE_PROPERTIES:
        if case.get(name) is not None:
            ET.SubElement(props, "property", name=name, value=xml_text(case[name]))
    if outcome.baseline_status is not None:
        ET.SubElement(props, "property", name="baseline_status", value=xml_text(outcome.baseline_status))
    if outcome.passes is not None:
        passed, runs = outcome.passes
        for name, value in (("runs_passed", passed), ("runs_graded", runs), ("pass_k", str(passed == runs).lower())):
            ET.SubElement(props, "property", name=name, value=xml_text(value))
    description = _describe(case)
    if outcome.outcome == "fail":
        failure = ET.SubElement(element, "failure", message=xml_text("; ".join(outcome.reasons)),
                                type="flakecheck.gate.gate")
        failure.text = xml_text(description)
    elif outcome.outcome == "flaky":
        flaky = ET.SubElement(element, "flakyFailure", message=xml_text(f"{case['status']}: {description}"),
                              type=f"flakecheck.{case['status']}")
        ET.SubElement(flaky, "stackTrace").text = xml_text(description)
    elif outcome.outcome == "quarantined" and outcome.quarantine is not None:
        q = outcome.quarantine
        ET.SubElement(element, "skipped",
                      message=xml_text(f"quarantined until {q.expires.isoformat()}: {q.reason}"))
    return element


def _describe(case: dict[str, Any]) -> str:
    if case.get("first_divergence") is None:
        return f"{case['status']}; min gap {case.get('min_gap')}"
    return (f"{case['status']}: first divergence at step {int(case['first_divergence'])} under "
            f"{case.get('divergence_composition')}: {case.get('ref_token')!r} -> {case.get('alt_token')!r} "
            f"(gap {case.get('gap_at_divergence')}); pass rate {case.get('pass_rate')}")


def junit_text(result: GateResult) -> str:
    return tree_text(junit_tree(result))


def tree_text(tree: ET.ElementTree) -> str:
    """A JUnit tree as the text of its file: indented, with the UTF-8 XML declaration."""
    ET.indent(tree)
    return ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True).decode("utf-8")
