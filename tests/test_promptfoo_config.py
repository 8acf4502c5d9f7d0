"""A promptfoo config as a suite (flakecheck.data.promptfoo_config through load_suite): prompts × tests as promptfoo
expands them, Nunjucks variables, defaultTest, file:// tests, assertions mapped with promptfoo's own rules, the
code- and model-graded ones never run, and bad configs refused naming the file, line and field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from flakecheck.data.suite import load_suite
from flakecheck.errors import InputError
from flakecheck.grading.checks import grade
from flakecheck.serve.response_record import prompt_sha256

CONFIG = """\
description: demo
prompts:
  - "Answer: {{ question | trim }}{% if hint %} (hint: {{ hint }}){% endif %}"
  - label: chat
    raw: '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "{{ question }}"}]'
providers:
  - id: openai:chat:smollm2
    config: {max_tokens: 20}
defaultTest:
  vars: {hint: ""}
  assert:
    - type: not-icontains
      value: sorry
tests:
  - description: capital
    vars: {question: " Capital of France? ", hint: a city}
    assert:
      - type: equals
        value: "{{ answer }}"
    options: {}
  - vars:
      question: [one, two]
    assert:
      - type: llm-rubric
        value: is polite
  - file://more.csv
"""


def write(tmp_path: Path, text: str = CONFIG, csv: str = "question,__expected,__description\nsix,contains: 6,six\n"
          ) -> Path:
    (tmp_path / "more.csv").write_text(csv)
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(text)
    return path


def test_prompts_times_tests_with_variables_and_default_test(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path))
    ids = [c.id for c in suite.cases]
    label = "Answer: {{ question | trim }}{% if hint %} (hint: {{ hint }}){% endif %}"
    assert len(label) > 40  # too long to be an id: prompt-1
    assert ids == ["capital [prompt-1]", "capital [chat]", "test-2 [prompt-1]", "test-2 [chat]",
                   "test-3 [prompt-1]", "test-3 [chat]", "six [prompt-1]", "six [chat]"]
    by_id = {c.id: c for c in suite.cases}
    assert by_id["capital [prompt-1]"].input == [{"role": "user",
                                                  "content": "Answer: Capital of France? (hint: a city)"}]
    assert by_id["capital [chat]"].input == [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": " Capital of France? "}]
    assert by_id["test-3 [prompt-1]"].input == [{"role": "user", "content": "Answer: two"}]  # a list var expands
    assert all(c.max_tokens == 20 for c in suite.cases)
    # defaultTest's assertion first, then the test's; an undefined var renders empty, as in Nunjucks
    capital = by_id["capital [prompt-1]"]
    assert [(c.type, c.negate, c.value) for c in capital.checks] == [("icontains", True, "sorry"), ("exact", False, "")]
    six = by_id["six [prompt-1]"]
    assert six.checks[-1].type == "contains" and six.checks[-1].value == "6"


def test_a_model_graded_assertion_leaves_the_case_ungraded_saying_which(tmp_path: Path) -> None:
    suite = load_suite(write(tmp_path))
    case = next(c for c in suite.cases if c.id == "test-2 [prompt-1]")
    assert case.checks == () and "llm-rubric" in case.metadata["ungraded"] and "tests[1].assert[1]" in \
        case.metadata["ungraded"]
    assert grade("anything", case.checks, case.targets) is None


@pytest.mark.parametrize("assertion, output, passes", [
    ({"type": "equals", "value": "Paris"}, "Paris", True),
    ({"type": "equals", "value": "Paris"}, " Paris", False),  # promptfoo compares exactly
    ({"type": "starts-with", "value": "Par"}, "Paris", True),
    ({"type": "starts-with", "value": "Par"}, " Paris", False),
    ({"type": "is-json"}, '{"a": 1}', True),
    ({"type": "is-json"}, 'here: {"a": 1}', False),  # the whole output must parse
    ({"type": "contains-json"}, 'here: {"a": 1}', True),
    ({"type": "levenshtein", "value": "kitten", "threshold": 3}, "sitting", True),
    ({"type": "levenshtein", "value": "kitten", "threshold": 2}, "sitting", False),
    ({"type": "not-regex", "value": "^\\d+$"}, "42", False),
    ({"type": "icontains-all", "value": ["a", "B"]}, "AB", True),
    ({"type": "contains-any", "value": "x, y"}, "y", True),
])
def test_assertions_grade_as_promptfoo_grades_them(tmp_path: Path, assertion: dict, output: str,
                                                   passes: bool) -> None:
    config = f"prompts: [hi]\ntests:\n  - assert: [{json.dumps(assertion)}]\n"
    [case] = load_suite(write(tmp_path, config)).cases
    assert grade(output, case.checks, case.targets) is passes


@pytest.mark.parametrize("config, line, field, words", [
    ("prompts: [hi]\ntests: [\n", None, None, "not valid YAML"),
    ("prompts: [hi]\ntests:\n  - vars: {a: 1}\n    assert:\n      - value: x\n", 3, "tests[0].assert[0]", "type"),
    ("prompts: [file://p.js]\ntests: [{vars: {}}]\n", None, "prompts[0]", "never runs"),
    ("prompts: [hi]\ntests: []\n", None, "tests", "no tests"),
    ("tests: [{vars: {}}]\n", None, "prompts", "no prompts"),
    ("prompts: ['{{ x.toUpperCase() }}']\ntests:\n  - vars: {x: a}\n", 3, "prompts[0]", "jinja2"),
    ("prompts: [hi]\ntests:\n  - assert: [{type: regex, value: '('}]\n", 3, "assert[0].value", "invalid regex"),
    ("!!python/object/apply:os.system ['echo no']\n", None, None, "not valid YAML"),
])
def test_a_bad_config_is_an_input_error_naming_file_line_and_field(tmp_path: Path, config: str, line: int | None,
                                                                   field: str | None, words: str) -> None:
    path = write(tmp_path, config)
    with pytest.raises(InputError) as error:
        load_suite(path)
    assert error.value.path == str(path) and words in str(error.value)
    if line is not None:
        assert error.value.line == line
    if field is not None:
        assert field in (error.value.field or "")


def test_the_digest_covers_the_files_the_config_reads(tmp_path: Path) -> None:
    first = load_suite(write(tmp_path)).sha256
    second = load_suite(write(tmp_path, csv="question,__expected\nseven,contains: 7\n")).sha256
    assert first != second


def test_case_ids_and_requests_match_what_the_importer_derives(tmp_path: Path) -> None:
    """A config run by flakecheck and the same config's promptfoo results name a case alike and key its prompt
    alike (what `import promptfoo --record` joins on)."""
    from flakecheck.data.promptfoo_config import case_id, chat_messages

    config = textwrap.dedent("""\
        prompts: ['{{q}}', {label: two, raw: 'Q: {{q}}'}]
        tests:
          - {description: same, vars: {q: a}}
          - {description: same, vars: {q: b}}
        """)
    suite = load_suite(write(tmp_path, config))
    assert [c.id for c in suite.cases] == ["same #1 [{{q}}]", "same #1 [two]", "same #2 [{{q}}]", "same #2 [two]"]
    assert case_id("same", 1, "two", 1, 2, repeated=True) == "same #2 [two]"
    raw = "Q: b"
    assert prompt_sha256(chat_messages(raw) or [{"role": "user", "content": raw}]) == prompt_sha256(
        suite.cases[3].input)
