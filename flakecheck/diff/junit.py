"""The diff's JUnit XML: one testcase per paired case, so CI test views list every case.

- `<failure>`: a regression the gate fails on;
- `<flakyFailure>`: noise (the verdicts differ in some pairing of compositions, within batch noise);
- passed: improvement, same, changed-text (its reason in a property);
- `<properties>` per case: class, pass rates per side, reference verdicts; on the suite: the score change, its
  interval and the gate's verdict.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from flakecheck.diff.classify import CaseDiff
from flakecheck.diff.result import DiffResult
from flakecheck.diff.score import change_sentence
from flakecheck.gate.junit import tree_text, xml_text


def diff_junit_tree(result: DiffResult) -> ET.ElementTree:
    name = f"flakecheck.diff.{result.b.record.suite_name}"
    failing = sum(_fails(result, c) for c in result.cases)
    root = ET.Element("testsuites", name="flakecheck diff", tests=str(len(result.cases)), failures=str(failing),
                      errors="0", skipped="0")
    suite = ET.SubElement(root, "testsuite", name=xml_text(name), tests=str(len(result.cases)),
                          failures=str(failing), errors="0", skipped="0", time="0")
    props = ET.SubElement(suite, "properties")
    score = result.score
    for key, value in (("run_a", result.a.path), ("run_b", result.b.path), ("paired_by", result.pairing.by),
                       ("score_change_pp", score.change_pp), ("score_noise_pp", score.noise_pp),
                       ("score_interval_low_pp", score.low_pp), ("score_interval_high_pp", score.high_pp),
                       ("score_sentence", change_sentence(score)), ("gate", "passed" if result.passed else "failed"),
                       *((f"count_{k}", n) for k, n in result.counts.items())):
        ET.SubElement(props, "property", name=key, value=xml_text(value))
    for case in result.cases:
        suite.append(_testcase(result, case, name))
    return ET.ElementTree(root)


def _fails(result: DiffResult, case: CaseDiff) -> bool:
    return case.kind == "regression" and result.counts["regression"] > result.gate.max_regressions


def _testcase(result: DiffResult, case: CaseDiff, classname: str) -> ET.Element:
    element = ET.Element("testcase", classname=xml_text(classname), name=xml_text(case.label), time="0")
    props = ET.SubElement(element, "properties")
    for key, value in (("class", case.kind), ("why", case.why), ("pass_rate_a", case.pass_rate_a),
                       ("pass_rate_b", case.pass_rate_b), ("reference_a", case.reference_a),
                       ("reference_b", case.reference_b)):
        if value is not None:
            ET.SubElement(props, "property", name=key, value=xml_text(value))
    if _fails(result, case):
        ET.SubElement(element, "failure", message=xml_text(f"regression: {case.why}"),
                      type="flakecheck.diff.regression").text = xml_text(f"A: {case.text_a}\nB: {case.text_b}")
    elif case.kind == "noise":
        flaky = ET.SubElement(element, "flakyFailure", message=xml_text(f"noise: {case.why}"),
                              type="flakecheck.diff.noise")
        ET.SubElement(flaky, "stackTrace").text = xml_text(case.why)
    return element


def diff_junit_text(result: DiffResult) -> str:
    return tree_text(diff_junit_tree(result))
