"""Suite loading: the field names of inspect_ai, promptfoo and OpenAI evals, and errors that point at the line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flakecheck.data.suite import Suite, check_prompt_lengths, load_suite
from flakecheck.errors import InputError, UserError
from flakecheck.grading.checks import grade

DEMO = Path(__file__).resolve().parent.parent / "suites" / "demo.jsonl"


def write_suite(tmp_path: Path, lines: list[object], name: str = "cases.jsonl") -> Path:
    path = tmp_path / name
    # ensure_ascii=False as editors write files: U+2028 and friends stay raw inside strings.
    text = "\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def load(tmp_path: Path, lines: list[object]) -> Suite:
    return load_suite(write_suite(tmp_path, lines))


# ------------------------------------------------------------------------------------- accepted shapes


def test_raw_and_chat_inputs_under_every_alias(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "Hi"}]
    suite = load(tmp_path, [
        {"id": "a", "input": "raw text"},
        {"id": "b", "input": chat},
        {"id": "c", "prompt": "raw prompt"},
        {"id": "d", "messages": chat},
        {"id": "e", "vars": {"question": "promptfoo var"}},
    ])
    by_id = {c.id: c for c in suite.cases}
    assert [by_id[i].is_chat for i in "abcde"] == [False, True, False, True, True]
    assert by_id["c"].input == "raw prompt" and by_id["d"].input == chat
    assert by_id["e"].input == [{"role": "user", "content": "promptfoo var"}]


def test_text_parts_in_message_content_are_joined(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]
    case = load(tmp_path, [{"input": [{"role": "user", "content": parts}]}]).cases[0]
    assert case.input == [{"role": "user", "content": "Hello there"}]


@pytest.mark.parametrize("key", ["target", "ideal", "expected", "answer"])
def test_every_target_alias(tmp_path: Path, key: str) -> None:
    case = load(tmp_path, [{"input": "q", key: ["x", "y"]}, {"input": "q2", key: 42}]).cases
    assert case[0].targets == ("x", "y")
    assert case[1].targets == ("42",)


@pytest.mark.parametrize("key", ["checks", "assert"])
def test_both_check_keys(tmp_path: Path, key: str) -> None:
    case = load(tmp_path, [{"input": "q", key: [{"type": "contains", "value": "ok"}]}]).cases[0]
    assert grade("ok!", case.checks, case.targets) is True
    assert grade("no", case.checks, case.targets) is False


def test_openai_evals_line(tmp_path: Path) -> None:
    line = {"input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            "ideal": "4"}
    case = load(tmp_path, [line]).cases[0]
    assert case.is_chat and case.targets == ("4",) and case.checks == ()
    assert grade(" 4 ", case.checks, case.targets) is True


def test_promptfoo_line(tmp_path: Path) -> None:
    line = {"vars": {"input": "Capital of France?"},
            "assert": [{"type": "icontains", "value": "paris"}, {"type": "not-contains", "value": "Lyon"}]}
    case = load(tmp_path, [line]).cases[0]
    assert grade("PARIS", case.checks, case.targets) is True
    assert grade("Paris or Lyon", case.checks, case.targets) is False


def test_inspect_ai_choices_are_listed_and_graded(tmp_path: Path) -> None:
    line = {"id": 3, "input": "Which is a planet?", "choices": ["Moon", "Mars", "Sun"], "target": "B",
            "metadata": {"kind": "mc"}}
    case = load(tmp_path, [line]).cases[0]
    assert case.id == "3" and case.metadata == {"kind": "mc"}
    assert "B) Mars" in case.input
    assert grade("The answer is B", case.checks, case.targets) is True
    assert grade("The answer is C", case.checks, case.targets) is False


def test_missing_ids_are_numbered_with_a_warning(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"input": "a"}, {"input": "b"}, {"input": "c"}])
    assert [c.id for c in suite.cases] == ["1", "2", "3"]
    assert any("numbered" in w for w in suite.warnings)


def test_blank_and_comment_lines_are_skipped_and_lines_counted(tmp_path: Path) -> None:
    suite = load(tmp_path, ["# a comment", "", {"id": "x", "input": "a"}, "   ", "// another", {"input": "b"}])
    assert [c.line for c in suite.cases] == [3, 6]


def test_sha256_is_of_the_file_bytes(tmp_path: Path) -> None:
    import hashlib

    path = write_suite(tmp_path, [{"input": "a"}])
    assert load_suite(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_unknown_fields_are_warned_about(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"input": "a", "targte": "x"}])
    assert any("targte" in w for w in suite.warnings)


def test_select_by_ids_and_limit(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"id": i, "input": "q"} for i in "abcde"])
    assert [c.id for c in suite.select(ids=["d", "b"]).cases] == ["b", "d"]
    assert [c.id for c in suite.select(limit=2).cases] == ["a", "b"]
    assert len(suite.cases) == 5  # select does not change the original
    with pytest.raises(UserError, match="'zz'"):
        suite.select(ids=["a", "zz"])


def test_check_prompt_lengths(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"id": "short", "input": "ab"}, {"id": "long", "input": "x" * 50, "max_tokens": 5}])
    check_prompt_lengths(suite, lambda case: len(case.input), context=100, default_max_tokens=10)
    with pytest.raises(InputError) as info:
        check_prompt_lengths(suite, lambda case: len(case.input), context=54, default_max_tokens=10)
    assert info.value.line == 2 and info.value.field == "input"
    assert "50 prompt tokens + 5 new tokens" in info.value.message and "54" in info.value.message


# -------------------------------------------------------------------------------------------- bad input


GOOD = {"id": "ok", "input": "fine"}


@pytest.mark.parametrize(("bad_line", "field", "words"), [
    ('{"id": "x", "input": ', None, "malformed JSON"),
    ("[1, 2]", None, "object"),
    ({"id": "x"}, "input", "missing input"),
    ({"input": 5}, "input", "number"),
    ({"prompt": [{"role": "user", "content": "x"}]}, "prompt", "string"),
    ({"messages": "hi"}, "messages", "list"),
    ({"input": [{"content": "x"}]}, "input[0].role", "role"),
    ({"input": [{"role": "user"}]}, "input[0].content", "content"),
    ({"input": []}, "input", "empty"),
    ({"input": "  "}, "input", "empty"),
    ({"input": "q", "max_tokens": 0}, "max_tokens", "positive integer"),
    ({"input": "q", "max_tokens": "16"}, "max_tokens", "positive integer"),
    ({"input": "q", "metadata": ["kind"]}, "metadata", "object"),
    ({"input": "q", "id": 1.5}, "id", "string or an integer"),
    ({"input": "q", "target": {"a": 1}}, "target", "string"),
    ({"input": "q", "target": "x", "answer": "y"}, "answer", "keep one"),
    ({"input": "q", "checks": [{"type": "fuzzy", "value": "x"}]}, "checks[0].type", "unknown check type"),
    ({"input": "q", "assert": [{"type": "regex", "value": "a("}]}, "assert[0].value", "invalid regex"),
    ({"input": "q", "checks": [{"type": "contains"}]}, "checks[0].value", "no target"),
    ({"input": "q", "checks": [{"type": "numeric"}], "target": "many"}, "target", "number"),
    ({"input": "q", "checks": [{"type": "choice"}], "target": "Paris"}, "target", "letter"),
    ({"input": "q", "checks": "fuzzy"}, "checks[0].type", "unknown check type"),
    ({"input": "q", "checks": 3}, "checks", "list"),
])
def test_bad_line_names_file_line_and_field(tmp_path: Path, bad_line: object, field: str | None,
                                            words: str) -> None:
    path = write_suite(tmp_path, ["# header", GOOD, bad_line])
    with pytest.raises(InputError) as info:
        load_suite(path)
    err = info.value
    assert (err.line, err.field) == (3, field)
    assert words in err.message
    assert str(path) in str(err) and ":3:" in str(err)


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = write_suite(tmp_path, [{"id": "a", "input": "x"}, {"id": "b", "input": "x"}, {"id": "a", "input": "y"}])
    with pytest.raises(InputError) as info:
        load_suite(path)
    assert info.value.line == 3 and info.value.field == "id" and "line 1" in info.value.message


def test_integer_and_string_ids_collide(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="line 1"):
        load(tmp_path, [{"id": 7, "input": "x"}, {"id": "7", "input": "y"}])


def test_empty_suite(tmp_path: Path) -> None:
    path = write_suite(tmp_path, ["# only a comment", ""])
    with pytest.raises(InputError) as info:
        load_suite(path)
    assert str(path) in str(info.value) and "no cases" in info.value.message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_suite(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(info.value) and "not found" in info.value.message


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"input": "ok"}\n{"input": "caf\xe9"}\n')
    with pytest.raises(InputError) as info:
        load_suite(path)
    assert info.value.line == 2 and "UTF-8" in info.value.message


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "input": "x"}\n')
    assert [c.id for c in load_suite(path).cases] == ["a"]


def test_loading_writes_nothing(tmp_path: Path) -> None:
    path = write_suite(tmp_path, [GOOD, {"id": "ok", "input": "dup"}])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError):
        load_suite(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ------------------------------------------------------------------------------------------- the demo


def test_demo_suite_loads_with_all_kinds_and_checks() -> None:
    suite = load_suite(DEMO)
    assert len(suite.cases) >= 100 and not suite.warnings
    kinds = Counter(c.metadata.get("kind") for c in suite.cases)
    assert set(kinds) >= {"factual_qa", "arithmetic", "multiple_choice", "writing", "extraction", "code"}
    assert sum(c.is_chat for c in suite.cases) > len(suite.cases) // 2
    assert any(not c.is_chat for c in suite.cases)
    assert sum(bool(c.checks or c.targets) for c in suite.cases) >= 0.8 * len(suite.cases)
    assert all(c.max_tokens is not None for c in suite.cases)
    assert sum(c.max_tokens or 0 for c in suite.cases) / len(suite.cases) <= 48
    assert any("<script>alert(1)</script>" in json.dumps(c.input) for c in suite.cases)


def test_demo_suite_shares_a_system_prompt_across_about_a_third() -> None:
    systems = Counter(c.input[0]["content"] for c in load_suite(DEMO).cases
                      if c.is_chat and c.input[0]["role"] == "system")
    assert systems and systems.most_common(1)[0][1] >= 30


# Correct answers written for a sample of each kind: the demo's checks must accept what a right answer looks like.
CORRECT_ANSWERS = {
    "qa-04": "Au", "qa-09": "Carbon dioxide (CO2).", "qa-21": " Rome.",
    "math-13": "1,024", "math-19": "-7", "math-20": "0.75",
    "mc-01": "B", "mc-17": "B", "mc-18": "D) 37",
    "write-08": "I received the package yesterday.",
    "extract-01": '{"name": "Maria", "age": 34, "city": "Lisbon"}',
    "extract-12": '```json\n{"company": "Acme Corporation", "year": 1987, "state": "Ohio"}\n```',
    "extract-16": "script",
    "code-08": "def factorial(n):\n    return 1 if n <= 1 else n * factorial(n - 1)",
    "code-10": "ls -la", "code-15": "{'a': 1, 'b': 2}", "code-16": " max(values)", "code-18": " x * x",
}


@pytest.mark.parametrize(("case_id", "answer"), sorted(CORRECT_ANSWERS.items()))
def test_demo_checks_accept_a_correct_answer_and_reject_an_empty_one(case_id: str, answer: str) -> None:
    case = next(c for c in load_suite(DEMO).cases if c.id == case_id)
    assert grade(answer, case.checks, case.targets) is True
    assert grade("", case.checks, case.targets) is False


ids = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and s != "")
texts = st.text(min_size=1, max_size=50).filter(lambda s: s.strip() != "")


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(ids, texts, st.lists(st.text(max_size=10), max_size=3)), min_size=1, max_size=5,
                     unique_by=lambda r: r[0]))
def test_any_ids_inputs_and_targets_load_back_unchanged(tmp_path: Path, rows: list[tuple[str, str, list[str]]]) -> None:
    path = write_suite(tmp_path, [{"id": i, "input": text, "target": targets} for i, text, targets in rows])
    cases = load_suite(path).cases
    assert [(c.id, c.input, list(c.targets)) for c in cases] == rows


def test_unicode_line_separators_inside_strings_do_not_split_lines(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"id": "a", "input": "one\u2028two\x85three"}, {"id": "b", "input": "x"}])
    assert suite.cases[0].input == "one\u2028two\x85three" and suite.cases[1].line == 2


def test_stop_sequences_are_read_as_a_list(tmp_path: Path) -> None:
    suite = load(tmp_path, [{"id": "a", "prompt": "x", "stop": "\n\n"}, {"id": "b", "prompt": "x", "stop": ["Q:", "#"]},
                            {"id": "c", "prompt": "x"}])
    assert [c.stop for c in suite.cases] == [("\n\n",), ("Q:", "#"), ()]


@pytest.mark.parametrize("bad", [3, [""], ["ok", 4], {"a": 1}])
def test_a_bad_stop_names_the_line_and_field(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "x", "stop": bad}])
    assert info.value.line == 2 and info.value.field == "stop"
