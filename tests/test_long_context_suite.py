"""suites/long-context.jsonl: its generator's output, prompts that fit, checks that accept the document's answer."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from flakecheck.data.suite import Case, load_suite
from flakecheck.grading.checks import grade

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "suites" / "long-context.jsonl"


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "make_long_context_suite.py"
    spec = importlib.util.spec_from_file_location("make_long_context_suite", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _text(case: Case) -> str:
    assert isinstance(case.input, list)
    return case.input[-1]["content"]


def _answer(case: Case) -> str | None:
    """The answer, read from the document itself (not from the generator's bookkeeping)."""
    text = _text(case)
    kind = case.id.split("-", 2)[2]
    if kind == "inventory":
        goods, crate = re.search(r"How many (.+) are in crate (\d+)\?", text).groups()
        return re.search(rf"^Crate {crate}: (\d+) {goods},", text, re.M).group(1)
    if kind == "timetable":
        time = re.search(r"does the (\d\d:\d\d) departure leave", text).group(1)
        return re.search(rf"^{time} departure to \w+, platform (\d),", text, re.M).group(1)
    if kind == "diary":
        what, day = re.search(r"Who (.+) on day (\d+)\?", text).groups()
        return re.search(rf"^Day {day}\. .*? (\w+) {what} before noon", text, re.M).group(1)
    if kind == "ledger":
        return re.findall(r"balance (-?\d+) crowns", text)[-1]
    if kind == "code":
        rule = re.search(r"What does rule_(\d+)\(10\) return", text).group(1)
        op, a, _, b = re.search(rf"def rule_{rule}\(x\):\n.*\n    return x (.) (\d) (.) (\d)", text).groups()
        return str({"+": 10 + int(a) + int(b), "*": 10 * int(a) * int(b), "-": 10 - int(a) - int(b)}[op])
    return None  # letters: a summary, ungraded


def test_suite_loads_with_long_prompts_and_checks_where_an_answer_exists() -> None:
    suite = load_suite(SUITE)
    assert 16 <= len(suite.cases) <= 24 and not suite.warnings
    for case in suite.cases:
        assert case.is_chat and case.max_tokens == 48
        assert 250 <= case.metadata["prompt_tokens"] <= 1400
        assert bool(case.checks) == (_answer(case) is not None), case.id


@pytest.mark.parametrize("case", load_suite(SUITE).cases, ids=lambda c: c.id)
def test_checks_pass_the_documents_answer_and_fail_another(case: Case) -> None:
    answer = _answer(case)
    if answer is None:
        assert not case.checks
        return
    for right in (answer, f"The answer is {answer}.", f"{answer}\n\nThat is all."):
        assert grade(right, case.checks, case.targets), (case.id, right)
    if answer.lstrip("-").isdigit():
        wrong = str(int(answer) + 1)
        for output in (wrong, f"The answer is {wrong}.", f"{answer}{answer}", f"{answer}.5", f"{answer}:00"):
            assert not grade(output, case.checks, case.targets), (case.id, output)
    else:
        assert not grade("Nobody did.", case.checks, case.targets)


@pytest.mark.slow
def test_file_is_what_the_generator_writes_and_fits_the_context() -> None:
    """Regenerated with SmolLM2's tokenizer and chat template: byte-identical, and prompt + 48 tokens fit 2,048."""
    from transformers import AutoTokenizer

    from flakecheck.engine.loader import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2")[0])

    def count(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False))

    cases = _generator().build(count)
    assert "".join(json.dumps(c) + "\n" for c in cases) == SUITE.read_text()
    for case in cases:
        assert count(case["input"]) == case["metadata"]["prompt_tokens"]
        assert case["metadata"]["prompt_tokens"] + case["max_tokens"] <= 2048
