"""The README's worked example: examples/humaneval/grade.py, driven through flakecheck's grader protocol with
hand-written outputs (correct, wrong, never-ending), so no model output is executed here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flakecheck.data.suite import load_suite
from flakecheck.grading.external import GradeRequest, grader_spec, run_grader

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "humaneval"


def test_the_example_suite_loads_and_every_case_names_its_test() -> None:
    suite = load_suite(EXAMPLE / "suite.jsonl")
    assert len(suite.cases) == 5 and not suite.warnings
    assert all({"entry_point", "test"} <= set(c.metadata) for c in suite.cases)


def test_the_example_grader_passes_correct_code_and_fails_the_rest() -> None:
    metadata = json.loads((EXAMPLE / "suite.jsonl").read_text().splitlines()[0])["metadata"]  # add(a, b)
    outputs = {
        "fenced": "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.",
        "bare": "def add(a, b):\n    return a + b",
        "wrong": "```python\ndef add(a, b):\n    return a - b\n```",
        "prose": "The sum of a and b is a plus b.",
        "endless": "```python\ndef add(a, b):\n    while True:\n        pass\n```",
    }
    requests = [GradeRequest("he-add", name, text, None, metadata) for name, text in outputs.items()]
    spec = grader_spec([sys.executable, str(EXAMPLE / "grade.py")], timeout_s=120)
    verdicts = run_grader(spec, requests)
    assert verdicts == {("he-add", "fenced"): True, ("he-add", "bare"): True, ("he-add", "wrong"): False,
                        ("he-add", "prose"): False, ("he-add", "endless"): False}
