"""inspect_ai-style string inputs on the default model get real answers (issue 11; slow: CI still runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flakecheck
from flakecheck.data.compositions import Composition

pytestmark = pytest.mark.slow

QUESTIONS = [("capital", "What is the capital of France?", "Paris"), ("legs", "How many legs does a spider have?", "8"),
             ("planet", "Which planet is known as the Red Planet?", "Mars"),
             ("author", "Who wrote Romeo and Juliet?", "Shakespeare"), ("sum", "What is 15 plus 27?", "42")]


def test_string_inputs_are_user_messages_and_get_non_empty_answers(tmp_path: Path) -> None:
    suite = tmp_path / "inspect.jsonl"
    suite.write_text("".join(json.dumps({"id": i, "input": q, "target": t, "checks": [{"type": "icontains",
                                                                                       "value": t}]}) + "\n"
                             for i, q, t in QUESTIONS))
    run = flakecheck.run_suite(suite, kernels="invariant", max_tokens=8, out=tmp_path / "run", html=False,
                               compositions=[Composition("solo"), Composition("batch4", max_batch=4)])
    assert run.meta["input_format"] == {"setting": "auto", "chat_template": True, "chat": 5, "raw": 0}
    assert len(run.runs) == 2 * len(QUESTIONS)
    empty = run.runs[run.runs.text.str.strip() == ""]
    assert empty.empty, f"empty answers: {sorted(set(empty.case_id))}"
    assert (run.runs.n_tokens > 1).all()
