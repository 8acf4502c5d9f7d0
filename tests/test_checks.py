"""Grading: every check type and alias passes a right answer, fails a wrong one, and `not-` inverts it."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakecheck.errors import InputError
from flakecheck.grading.checks import CHECK_TYPES, Check, check_label, extract_choice, grade, parse_check, parse_number


def check(obj: object) -> Check:
    return parse_check(obj, "suite.jsonl", 7, "checks[0]")


# (check object, targets, an output that passes, an output that fails)
CASES = [
    ({"type": "exact", "value": "Paris"}, [], "  Paris \n", "Paris, France"),
    ({"type": "equals", "value": "Paris"}, [], "Paris", "paris"),
    ({"type": "exact"}, ["Rome", "Roma"], "Roma", "Milan"),
    ({"type": "contains", "value": "Paris"}, [], "It is Paris.", "It is paris."),
    ({"type": "includes", "value": "Paris"}, [], "Paris!", "Lyon"),
    ({"type": "contains"}, ["Paris"], "The capital is Paris", "Lyon"),
    ({"type": "icontains", "value": "PARIS"}, [], "it is paris", "it is lyon"),
    ({"type": "starts-with", "value": "Yes"}, [], "  Yes, it is.", "No. Yes."),
    ({"type": "starts_with", "value": "Yes"}, [], "Yes", "yes"),
    ({"type": "regex", "value": r"\b\d{4}\b"}, [], "in 1969 it", "in 69 it"),
    ({"type": "pattern", "value": r"^def "}, [], "def f(): pass", "x = 1"),
    ({"type": "regex", "value": r"Answer: (\w+)"}, ["42"], "Answer: 42", "Answer: 41"),
    ({"type": "regex", "value": "hello", "ignore_case": True}, [], "HeLLo", "bye"),
    ({"type": "numeric", "value": 42}, [], "The result is 42.", "The result is 43."),
    ({"type": "numeric"}, ["1234"], "It costs $1,234 in total", "It costs $1,235"),
    ({"type": "numeric", "value": 3.14, "abs_tol": 0.01}, [], "about 3.1416", "about 3.2"),
    ({"type": "numeric", "value": 1000, "rel_tol": 0.01}, [], "1005", "1020"),
    ({"type": "numeric", "value": "-7"}, [], "x = -7", "x = 7"),
    ({"type": "choice"}, ["B"], "The answer is (B).", "The answer is (C)."),
    ({"type": "choice", "value": "C"}, [], "C. Mercury", "A. Venus"),
    ({"type": "choice"}, ["(D)"], "Answer: D", "Answer: A"),
    ({"type": "json"}, [], '{"a": 1}', '{"a": 1'),
    ({"type": "is-json"}, [], '```json\n{"a": [1, 2]}\n```', "not json"),
    ({"type": "json", "required": ["name", "age"]}, [], 'Here: {"name": "Ann", "age": 3}', '{"name": "Ann"}'),
    ({"type": "json", "value": {"city": "New York"}}, [], '{"city": "new york", "x": 1}', '{"city": "Boston"}'),
    ({"type": "json", "value": {"age": 34}}, [], '{"age": "34"}', '{"age": "34 years"}'),
    ({"type": "json", "value": {"ok": True}}, [], '{"ok": true}', '{"ok": 1}'),
    ({"type": "contains-any", "value": ["cat", "dog"]}, [], "a dog", "a bird"),
    ({"type": "contains-any", "value": "cat, dog"}, [], "a cat", "a bird"),
    ({"type": "contains-any"}, ["cat", "dog"], "dog", "bird"),
    ({"type": "contains-all", "value": ["cat", "dog"]}, [], "cat and dog", "cat alone"),
    ({"type": "icontains-all", "value": ["cat", "dog"]}, [], "CAT and DOG", "CAT alone"),
    ({"type": "Contains_All", "value": ["x"]}, [], "x", "y"),
    # the eval harnesses' scorers (inspect_ai 0.3.285, lm-eval 0.4.13), cases read off their documentation
    ({"type": "match"}, ["Paris"], "The capital of France is paris.", "Paris is the capital."),
    ({"type": "match", "location": "begin"}, ["Paris"], "Paris is the capital.", "The capital is Paris"),
    ({"type": "match", "location": "any", "ignore_case": False}, ["Paris"], "I say Paris, yes", "I say paris"),
    ({"type": "match", "numeric": True}, ["1234"], "It costs $1,234.", "It costs 1234 or 25"),
    ({"type": "match", "numeric": True, "location": "begin"}, ["5"], "5 apples, not 3", "25 apples"),
    ({"type": "exact", "normalize": "squad"}, ["Paris"], "The Paris!", "Paris, France"),
    ({"type": "exact", "normalize": "none"}, ["Paris"], "Paris", "Paris "),  # promptfoo's equals
    ({"type": "json", "whole": True}, [], ' {"a": 1}\n', 'Here: {"a": 1}'),  # promptfoo's is-json
    ({"type": "levenshtein", "value": "colour"}, [], "color", "a colourful day"),  # distance 1; 9 > default 5
    ({"type": "levenshtein", "value": "kitten", "threshold": 2}, [], "sitten", "sitting"),  # 1; 3 > 2
    ({"type": "regex", "value": r"ANSWER\s*:\s*(\w+)", "ignore_case": True, "groups": "any"}, ["yes"],
     "answer: YES", "ANSWER: no"),
    ({"type": "regex", "value": r"(\d+) and (\d+)", "groups": "all"}, ["3"], "3 and 3", "3 and 4"),
    ({"type": "choice", "format": "answer", "letters": "ABCD"}, ["C"], "I think so.\nANSWER: c", "ANSWER: C, D"),
    ({"type": "choice", "format": "answer", "letters": "ABCD", "multiple": True}, ["A,C"], "ANSWER: A, C",
     "ANSWER: A"),
    ({"type": "exact-match"}, ["Paris"], "Paris", " Paris"),
    ({"type": "exact-match", "ignore_case": True, "ignore_punctuation": True,
      "filters": [{"function": "regex", "regex_pattern": "(\\w+)"}, {"function": "take_first"}]},
     ["paris"], "Paris. It is.", "It is Paris."),
    ({"type": "exact-match", "regexes_to_ignore": [","],
      "filters": [{"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"}]},
     ["1234"], "so #### 1,234", "so 1234"),
]


@pytest.mark.parametrize(("obj", "targets", "good", "bad"), CASES, ids=[str(c[0]) for c in CASES])
def test_check_passes_good_fails_bad_and_not_inverts(obj: dict, targets: list[str], good: str, bad: str) -> None:
    parsed = check(obj)
    assert grade(good, [parsed], targets) is True
    assert grade(bad, [parsed], targets) is False
    negated = check({**obj, "type": "not-" + obj["type"]})
    assert negated.negate and negated.type == parsed.type
    assert grade(good, [negated], targets) is False
    assert grade(bad, [negated], targets) is True


def test_every_canonical_type_is_covered_by_the_examples() -> None:
    covered = {check(obj).type for obj, *_ in CASES}
    assert covered == set(CHECK_TYPES)


@pytest.mark.parametrize(("alias", "canonical"), [("equals", "exact"), ("includes", "contains"),
                                                  ("is-json", "json"), ("NOT-Equals", "exact")])
def test_aliases_normalise_to_canonical_types(alias: str, canonical: str) -> None:
    assert check({"type": alias, "value": "x"} if canonical != "json" else {"type": alias}).type == canonical


def test_all_checks_must_pass() -> None:
    checks = [check({"type": "contains", "value": "a"}), check({"type": "contains", "value": "b"})]
    assert grade("ab", checks, []) is True
    assert grade("a", checks, []) is False


def test_no_checks_means_whitespace_normalised_exact_against_any_target() -> None:
    assert grade("  Paris\n", [], ["Lyon", "Paris"]) is True
    assert grade("Paris France", [], ["Paris  France "]) is True
    assert grade("Paris.", [], ["Paris"]) is False


def test_no_checks_and_no_target_is_ungraded() -> None:
    assert grade("anything", [], []) is None


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
space = st.text(alphabet=" \t\n\r", max_size=5)


@given(value=text, before=space, after=space)
def test_exact_is_invariant_to_surrounding_whitespace(value: str, before: str, after: str) -> None:
    exact = check({"type": "exact", "value": value})
    assert grade(before + value + after, [exact], []) is True
    assert grade(before + value + after, [], [value]) is True


@given(value=text, noise=text)
def test_contains_holds_for_any_surrounding_text(value: str, noise: str) -> None:
    assert grade(noise + value + noise, [check({"type": "contains", "value": value})], []) is True


@given(number=st.integers(min_value=-10**9, max_value=10**9))
def test_numeric_reads_back_any_integer_it_is_shown(number: int) -> None:
    assert parse_number(f"The total is {number} units") == number
    assert parse_number(f"The total is {number:,} units") == number


def test_choice_extraction_ignores_the_article_a() -> None:
    assert extract_choice("A cat sat on B") == "B"
    assert extract_choice("I pick (A)") == "A"
    assert extract_choice("no letter here") is None


def test_catastrophic_regex_returns_a_verdict_quickly() -> None:
    evil = check({"type": "regex", "value": r"(a+)+$"})
    output = "a" * 5000 + "b"
    start = time.perf_counter()
    verdict = grade(output, [evil], [])
    negated = grade(output, [check({"type": "not-regex", "value": r"(a+)+$"})], [])
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0  # two bounded searches; unbounded backtracking would take far longer
    # The search runs out of time, and an undecided check fails whether negated or not.
    assert verdict is False
    assert negated is False


@pytest.mark.parametrize(("obj", "field"), [
    ({"type": "fuzzy", "value": "x"}, "checks[0].type"),
    ({"value": "x"}, "checks[0].type"),
    (["contains"], "checks[0]"),
    ({"type": "regex", "value": "(unclosed"}, "checks[0].value"),
    ({"type": "regex"}, "checks[0].value"),
    ({"type": "numeric", "value": "many"}, "checks[0].value"),
    ({"type": "numeric", "value": 1, "abs_tol": -1}, "checks[0].abs_tol"),
    ({"type": "choice", "value": "Z"}, "checks[0].value"),
    ({"type": "json", "required": "name"}, "checks[0].required"),
    ({"type": "contains-any", "value": []}, "checks[0].value"),
    ({"type": "contains", "value": "x", "bogus": 1}, "checks[0].bogus"),
])
def test_bad_checks_raise_input_errors_naming_file_line_and_field(obj: object, field: str) -> None:
    with pytest.raises(InputError) as info:
        check(obj)
    assert (info.value.path, info.value.line, info.value.field) == ("suite.jsonl", 7, field)
    assert "suite.jsonl:7" in str(info.value)


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(InputError) as info:
        check({"type": "python", "value": "import os"})
    assert all(name in info.value.message for name in CHECK_TYPES)


def test_labels_name_the_type_negation_and_value() -> None:
    label = check_label(check({"type": "not-contains", "value": "foo"}))
    assert label.startswith("not-contains") and "foo" in label
    assert "(target)" in check_label(check({"type": "choice"}))
    assert len(check_label(check({"type": "contains", "value": "x" * 500}))) < 80
