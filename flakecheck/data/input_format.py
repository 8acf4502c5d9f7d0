"""What the model is sent for a case: chat messages (through its chat template) or raw completion text.

The convention follows the suite formats eval teams already use:

- `input` as a string is one user chat message when the model has a chat template (inspect_ai's
  convention: an instruct model sent a bare question without its template often ends its turn at once),
  and raw completion text when the model has none;
- `prompt` is raw completion text (promptfoo's and the completions API's convention);
- `messages`, an `input` list of `{role, content}`, and promptfoo `vars` are chat.

`--input-format` overrides it for every case: `chat` sends every string as one user message (a model
without a chat template is then an error); `raw` sends every string as raw text, and a chat input that is
a single user message as its text (any other conversation cannot be sent raw without inventing a format:
an error naming the case's line). `auto` (the default) is the convention above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flakecheck.data.suite import Case, Messages, Suite
from flakecheck.errors import InputError, UserError

INPUT_FORMATS = ("auto", "chat", "raw")
RAW_KEYS = ("prompt",)  # keys whose string is raw completion text under `auto`


class FormatMismatch(ValueError):
    """A case cannot be sent in the requested format; the message says why (no location: see resolve_inputs)."""


@dataclass(frozen=True)
class AppliedFormat:
    """What a run applied, as meta.json records it."""

    setting: str
    chat_template: bool
    chat: int
    raw: int

    def to_dict(self) -> dict[str, object]:
        return {"setting": self.setting, "chat_template": self.chat_template, "chat": self.chat, "raw": self.raw}


def check_input_format(value: str) -> str:
    if value not in INPUT_FORMATS:
        raise UserError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got {value!r}")
    return value


def case_prompt(case: Case, input_format: str, has_chat_template: bool) -> str | Messages:
    """The chat messages or the raw text to send for `case` (FormatMismatch when it cannot be sent so)."""
    check_input_format(input_format)
    if isinstance(case.input, list):
        if input_format == "raw":
            if len(case.input) == 1 and case.input[0]["role"] == "user":
                return case.input[0]["content"]
            raise FormatMismatch("--input-format raw can send a chat input only when it is one user message; "
                                 "give this case a 'prompt' string instead")
        if not has_chat_template:
            raise FormatMismatch("chat messages need the model's chat template and this model has none; "
                                 "give the case a 'prompt' string (raw completion text) instead")
        return case.input
    wants_chat = input_format == "chat" or (
        input_format == "auto" and case.input_key not in RAW_KEYS and has_chat_template)
    if not wants_chat:
        return case.input
    if not has_chat_template:
        raise FormatMismatch("--input-format chat needs the model's chat template and this model has none")
    return [{"role": "user", "content": case.input}]


def resolve_inputs(suite: Suite, input_format: str, has_chat_template: bool) -> tuple[dict[str, str | Messages],
                                                                                       AppliedFormat]:
    """Every case's prompt by case id, and the counts meta.json records; InputError at the first case that
    cannot be sent in the requested format (file, line, field)."""
    check_input_format(input_format)
    prompts: dict[str, str | Messages] = {}
    for case in suite.cases:
        try:
            prompts[case.id] = case_prompt(case, input_format, has_chat_template)
        except FormatMismatch as exc:
            raise InputError(str(suite.path), case.line, case.input_key, f"case '{case.id}': {exc}") from None
    n_chat = sum(isinstance(p, list) for p in prompts.values())
    return prompts, AppliedFormat(input_format, has_chat_template, n_chat, len(prompts) - n_chat)


def encode_inputs(suite: Suite, input_format: str, has_chat_template: bool,
                  encode: Callable[[str | Messages], Sequence[int]]) -> tuple[dict[str, list[int]], AppliedFormat]:
    """Prompt token ids by case id through `encode` (the engine's encode_prompt), and what was applied."""
    prompts, applied = resolve_inputs(suite, input_format, has_chat_template)
    return {case_id: list(encode(prompt)) for case_id, prompt in prompts.items()}, applied


def has_chat_template(tokenizer: object) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
