"""What a case sends the model: inspect_ai's string `input` is a user message, `prompt` is raw text (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.data.input_format import case_prompt, has_chat_template, resolve_inputs
from flakecheck.data.suite import load_suite
from flakecheck.engine import encode_prompt, load_model
from flakecheck.errors import InputError, UserError
from tests.test_run import cli_run

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
LINES = [
    {"id": "input-str", "input": "What is 2 + 2?"},
    {"id": "prompt-str", "prompt": "The capital of Italy is"},
    {"id": "input-chat", "input": CHAT},
    {"id": "messages", "messages": [{"role": "user", "content": "Hello"}]},
    {"id": "vars", "vars": {"question": "Capital of France?"}},
]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture
def suite(tmp_path: Path):
    return load_suite(write(tmp_path / "mixed.jsonl", LINES))


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_auto_follows_the_ecosystem_when_the_model_has_a_chat_template(suite) -> None:
    by_id = {c.id: case_prompt(c, "auto", True) for c in suite.cases}
    assert by_id == {"input-str": user("What is 2 + 2?"), "prompt-str": "The capital of Italy is",
                     "input-chat": CHAT, "messages": user("Hello"), "vars": user("Capital of France?")}


def test_auto_without_a_chat_template_sends_strings_raw_and_refuses_chat(suite) -> None:
    strings = [c for c in suite.cases if isinstance(c.input, str)]
    assert [case_prompt(c, "auto", False) for c in strings] == ["What is 2 + 2?", "The capital of Italy is"]
    with pytest.raises(InputError) as info:
        resolve_inputs(suite, "auto", has_chat_template=False)
    assert info.value.line == 3 and info.value.field == "input" and "chat template" in info.value.message


def test_chat_override_makes_every_string_a_user_message(suite) -> None:
    prompts, applied = resolve_inputs(suite, "chat", has_chat_template=True)
    assert prompts["prompt-str"] == user("The capital of Italy is")
    assert prompts["input-str"] == user("What is 2 + 2?")
    assert (applied.chat, applied.raw) == (5, 0)
    with pytest.raises(InputError, match="chat template"):
        resolve_inputs(load_suite(suite.path), "chat", has_chat_template=False)


def test_raw_override_sends_strings_and_single_user_messages_raw(tmp_path: Path) -> None:
    one_user = [line for line in LINES if line["id"] != "input-chat"]
    prompts, applied = resolve_inputs(load_suite(write(tmp_path / "raw.jsonl", one_user)), "raw", True)
    assert prompts == {"input-str": "What is 2 + 2?", "prompt-str": "The capital of Italy is",
                       "messages": "Hello", "vars": "Capital of France?"}
    assert (applied.setting, applied.chat, applied.raw) == ("raw", 0, 4)


def test_raw_override_refuses_a_conversation_naming_its_line(suite) -> None:
    with pytest.raises(InputError) as info:
        resolve_inputs(suite, "raw", has_chat_template=True)
    assert (info.value.path, info.value.line) == (str(suite.path), 3) and "input-chat" in info.value.message


def test_counts_of_what_was_applied(suite) -> None:
    _, applied = resolve_inputs(suite, "auto", has_chat_template=True)
    assert applied.to_dict() == {"setting": "auto", "chat_template": True, "chat": 4, "raw": 1}


def test_unknown_format_is_a_usage_error(suite) -> None:
    with pytest.raises(UserError, match="--input-format"):
        resolve_inputs(suite, "markdown", has_chat_template=True)


def test_a_string_input_encodes_exactly_as_one_user_message_through_the_template(tiny_model_dir, suite) -> None:
    model = load_model(str(tiny_model_dir), "float32")
    assert has_chat_template(model.tokenizer)
    prompts, _ = resolve_inputs(suite, "auto", has_chat_template(model.tokenizer))
    as_chat = model.tokenizer.apply_chat_template(user("What is 2 + 2?"), add_generation_prompt=True, tokenize=False)
    assert model.tokenizer.decode(encode_prompt(model, prompts["input-str"])) == as_chat
    raw = model.tokenizer("The capital of Italy is", add_special_tokens=True)["input_ids"]
    assert encode_prompt(model, prompts["prompt-str"]) == list(raw)


def test_meta_json_records_the_applied_format_and_the_resume_fingerprint_sees_it(tiny_model_dir, tmp_path) -> None:
    path = write(tmp_path / "two.jsonl", [LINES[0], LINES[1]])
    model = load_model(str(tiny_model_dir), "bfloat16")
    options = dict(model=model, kernels="invariant", max_tokens=3, html=False,
                   compositions=[Composition("solo")])
    run = flakecheck.run_suite(path, out=tmp_path / "auto", **options)
    assert run.meta["input_format"] == {"setting": "auto", "chat_template": True, "chat": 1, "raw": 1}
    run = flakecheck.run_suite(path, out=tmp_path / "raw", input_format="raw", **options)
    assert run.meta["input_format"] == {"setting": "raw", "chat_template": True, "chat": 0, "raw": 2}


def test_cli_rejects_an_unknown_input_format_before_loading_anything(tmp_path, monkeypatch, capsys) -> None:
    path = write(tmp_path / "one.jsonl", [LINES[0]])
    code, _, err = cli_run(monkeypatch, capsys, "run", str(path), "--model", str(tmp_path / "no-such-model"),
                           "--input-format", "prose", "--out", str(tmp_path / "out"))
    assert code == 2 and "--input-format" in err and not (tmp_path / "out").exists()
