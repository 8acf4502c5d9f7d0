"""Load an eval suite: JSONL, one case per line, in the field names eval teams already have.

Accepted per line (a JSON object):

- id: `id` (string or integer; integers become strings). Cases without one are numbered by their position
  ("1".."N") with a warning; a duplicate id is an error naming both lines.
- input: `input` (a string is one user chat message when the model has a chat template, as in inspect_ai,
  and raw completion text when it has none; a list of `{role, content}` messages is chat, as in inspect_ai and
  OpenAI evals), `prompt` (a string, always raw completion text, as in promptfoo and the completions API),
  `messages` (a chat list). A message's content may also be a list of `{"type": "text", "text": ...}` parts
  (OpenAI style), which are joined. promptfoo test cases put the input under `vars`: `vars.input`,
  `vars.prompt` or `vars.question` becomes one user message when none of the above is present. A case
  remembers which key its input came from (`Case.input_key`); `run --input-format chat|raw` overrides the
  convention for every case (see flakecheck.data.input_format, which turns a case into what the model is sent).
- choices: inspect_ai's `choices` (list of strings) are appended to a string input as "A) ...", one a line;
  a case with choices and no checks gets a `choice` check against its target.
- target: `target`, `ideal` (OpenAI evals), `expected`, `answer` (a string, a number, or a list of them).
- checks: `checks` or `assert` (promptfoo), a list of check objects or a single one (see flakecheck.grading.checks).
- `max_tokens` (positive integer), `metadata` (object, carried into reports).
- `stop`: stop sequences (a string or a list of non-empty strings), as the OpenAI API takes them: the answer ends
  with the token that completes the first occurrence and its text is cut before it (what a harness such as
  lm-eval sends, so an imported suite replays the harness's requests exactly; see flakecheck.data.stops).

Two spellings of one field on a line (say `target` and `answer`) are an error rather than a silent choice.
Other keys are ignored, with one warning listing them (it catches typos such as `targte`).

Blank lines, and lines whose first non-blank characters are `#` or `//`, are skipped (they can never be valid
JSON, so skipping them loses nothing); line numbers in errors are the file's own.

A `.yaml` / `.yml` file is a promptfoo config: its prompts × tests become the cases (see
flakecheck.data.promptfoo_config), each parsed as a line here.

Every problem is an InputError naming the file, the 1-based line and the field; load_suite only reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flakecheck.data.jsonl import json_kind, json_objects
from flakecheck.data.promptfoo_config import is_promptfoo_config, read_promptfoo_config
from flakecheck.errors import InputError, UserError
from flakecheck.grading.checks import TARGET_TYPES, Check, choice_letter_of_target, parse_check, parse_number

Messages = list[dict[str, str]]

_INPUT_KEYS = ("input", "prompt", "messages")
_TARGET_KEYS = ("target", "ideal", "expected", "answer")
_CHECK_KEYS = ("checks", "assert")
_KNOWN_KEYS = {"id", *_INPUT_KEYS, *_TARGET_KEYS, *_CHECK_KEYS, "max_tokens", "metadata", "choices", "vars", "stop"}
_VARS_INPUT_KEYS = ("input", "prompt", "question")
_CHOICE_LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Case:
    id: str
    input: str | Messages
    targets: tuple[str, ...]
    checks: tuple[Check, ...]
    max_tokens: int | None
    metadata: dict[str, Any] = field(hash=False)
    line: int
    input_key: str = "input"  # input | prompt | messages | vars: decides chat vs raw (flakecheck.data.input_format)
    stop: tuple[str, ...] = ()  # stop sequences: the answer ends where the first one appears

    @property
    def is_chat(self) -> bool:
        return isinstance(self.input, list)


@dataclass
class Suite:
    path: Path
    cases: list[Case]
    sha256: str
    warnings: list[str] = field(default_factory=list)

    def select(self, ids: Sequence[str] | None = None, limit: int | None = None) -> Suite:
        """The cases named by `ids` (in suite order), then the first `limit` of them."""
        cases = self.cases
        if ids:
            wanted = {str(i).strip() for i in ids if str(i).strip()}
            known = {case.id for case in cases}
            unknown = sorted(wanted - known)
            if unknown:
                raise UserError(f"--ids: no case with id {', '.join(repr(u) for u in unknown)} in {self.path}")
            cases = [case for case in cases if case.id in wanted]
        if limit is not None:
            if limit < 1:
                raise UserError(f"--limit must be at least 1, got {limit}")
            cases = cases[:limit]
        return replace(self, cases=list(cases), warnings=list(self.warnings))


def load_suite(path: str | Path) -> Suite:
    path = Path(path)
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(name, None, None, "suite file not found") from None
    except IsADirectoryError:
        raise InputError(name, None, None, "is a directory, not a suite file") from None
    except OSError as err:
        raise InputError(name, None, None, f"cannot read the suite: {err.strerror or err}") from None
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data  # a BOM some editors write
    if is_promptfoo_config(path):
        return _promptfoo_suite(path, body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        line = body.count(b"\n", 0, err.start) + 1
        raise InputError(name, line, None, f"not UTF-8 (byte 0x{body[err.start]:02x})") from None

    warnings: list[str] = []
    cases: list[Case] = []
    first_line_of_id: dict[str, int] = {}
    unknown_keys: set[str] = set()
    unnumbered = 0
    auto_numbered: set[int] = set()  # lines whose case got its id from its position
    for number, obj in json_objects(name, text, comments=("#", "//")):
        unknown_keys |= set(obj) - _KNOWN_KEYS
        case = _parse_case(obj, name, number, position=len(cases) + 1)
        numbered = obj.get("id") is None
        unnumbered += numbered
        if case.id in first_line_of_id:
            how = "this case has no id and was numbered" if numbered else "duplicate id"
            first = first_line_of_id[case.id]
            raise InputError(name, number, "id", f"{how} '{case.id}', already used on line {first}"
                             + (" (a case numbered by position)" if first in auto_numbered else ""))
        first_line_of_id[case.id] = number
        if numbered:
            auto_numbered.add(number)
        cases.append(case)
    if not cases:
        raise InputError(name, None, None, "the suite has no cases")
    if unnumbered:
        warnings.append(f"{name}: {unnumbered} case(s) without an id were numbered by position (1..{len(cases)})")
    if unknown_keys:
        warnings.append(f"{name}: ignored unknown field(s): {', '.join(sorted(unknown_keys))}")
    return Suite(path, cases, hashlib.sha256(data).hexdigest(), warnings)


def _promptfoo_suite(path: Path, body: bytes) -> Suite:
    config = read_promptfoo_config(path, body)
    cases: list[Case] = []
    seen: dict[str, int] = {}
    for line, obj in config.lines:
        case = _parse_case(obj, str(path), line, position=len(cases) + 1)
        if case.id in seen:
            raise InputError(str(path), line, "description", f"two cases have the id '{case.id}' (lines "
                             f"{seen[case.id]} and {line}): give the tests or prompts distinct descriptions/labels")
        seen[case.id] = line
        cases.append(case)
    return Suite(path, cases, config.digest, config.warnings)


def check_prompt_lengths(suite: Suite, count_tokens: Callable[[Case], int], context: int,
                         default_max_tokens: int) -> None:
    """InputError at the first case whose prompt plus its new tokens do not fit the model's context."""
    too_long: list[tuple[Case, int, int]] = []
    for case in suite.cases:
        n_prompt = count_tokens(case)
        n_new = case.max_tokens if case.max_tokens is not None else default_max_tokens
        if n_prompt + n_new > context:
            too_long.append((case, n_prompt, n_new))
    if too_long:
        case, n_prompt, n_new = too_long[0]
        more = f" ({len(too_long) - 1} more case(s) too long)" if len(too_long) > 1 else ""
        raise InputError(str(suite.path), case.line, "input",
                         f"case '{case.id}': {n_prompt} prompt tokens + {n_new} new tokens exceed the model's "
                         f"context of {context}{more}")


# ---------------------------------------------------------------------------------------------- parsing


def _parse_case(obj: dict[str, Any], path: str, line: int, position: int) -> Case:
    def fail(field_name: str | None, message: str) -> InputError:
        return InputError(path, line, field_name, message)

    case_id = _parse_id(obj.get("id"), position, fail)
    input_key, raw_input = _one_of(obj, _INPUT_KEYS, fail)
    if input_key is None:
        raw_input, input_key = _input_from_vars(obj.get("vars"), fail)
    if input_key is None:
        raise fail("input", "missing input: give 'input', 'prompt' or 'messages'")
    case_input = _parse_input(input_key, raw_input, fail)

    target_key, raw_target = _one_of(obj, _TARGET_KEYS, fail)
    targets = _parse_targets(target_key or "target", raw_target, fail)

    check_key, raw_checks = _one_of(obj, _CHECK_KEYS, fail)
    check_key = check_key or "checks"
    if raw_checks is None:
        raw_checks = []
    elif isinstance(raw_checks, (dict, str)):
        raw_checks = [raw_checks]
    elif not isinstance(raw_checks, list):
        raise fail(check_key, f"expected a list of checks, got {json_kind(raw_checks)}")
    checks = tuple(parse_check(c, path, line, f"{check_key}[{i}]") for i, c in enumerate(raw_checks))

    choices = obj.get("choices")
    if choices is not None:
        case_input = _append_choices(case_input, choices, fail)
        if not checks and targets:
            checks = (Check("choice", None, False, {"letters": _CHOICE_LETTERS[: len(choices)]}),)
    for i, check in enumerate(checks):
        _check_against_targets(check, targets, f"{check_key}[{i}]", fail)

    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise fail("max_tokens", f"expected a positive integer, got {json.dumps(max_tokens)}")
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise fail("metadata", f"expected an object, got {json_kind(metadata)}")
    return Case(case_id, case_input, targets, checks, max_tokens, metadata, line, input_key,
                _parse_stop(obj.get("stop"), fail))


def _parse_stop(raw: Any, fail: Callable[..., InputError]) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise fail("stop", f"expected a non-empty string or a list of them, got {json_kind(raw)}")
    return tuple(items)


def _one_of(obj: dict[str, Any], keys: Sequence[str], fail: Callable[..., InputError]) -> tuple[str | None, Any]:
    present = [k for k in keys if k in obj and obj[k] is not None]
    if len(present) > 1:
        raise fail(present[1], f"both '{present[0]}' and '{present[1]}' given; keep one")
    return (present[0], obj[present[0]]) if present else (None, None)


def _parse_id(raw: Any, position: int, fail: Callable[..., InputError]) -> str:
    if raw is None:
        return str(position)
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise fail("id", f"expected a string or an integer, got {json_kind(raw)}")
    text = str(raw).strip()
    if not text:
        raise fail("id", "the id is empty")
    return text


def _input_from_vars(raw_vars: Any, fail: Callable[..., InputError]) -> tuple[Any, str | None]:
    if not isinstance(raw_vars, dict):
        return None, None
    for key in _VARS_INPUT_KEYS:
        if raw_vars.get(key) is not None:
            value = raw_vars[key]
            if not isinstance(value, str):
                raise fail(f"vars.{key}", f"expected a string, got {json_kind(value)}")
            # promptfoo renders its prompt template into a chat provider's user turn; one user message
            # is the closest we get without the template.
            return [{"role": "user", "content": value}], "vars"
    return None, None


def _parse_input(key: str, raw: Any, fail: Callable[..., InputError]) -> str | Messages:
    if key == "prompt" and not isinstance(raw, str):
        raise fail(key, f"expected a string (a raw completion prompt), got {json_kind(raw)}")
    if key == "messages" and not isinstance(raw, list):
        raise fail(key, f"expected a list of chat messages, got {json_kind(raw)}")
    if isinstance(raw, str):
        if not raw.strip():
            raise fail(key, "the input is empty")
        return raw
    if not isinstance(raw, list):
        raise fail(key, f"expected a string or a list of chat messages, got {json_kind(raw)}")
    if not raw:
        raise fail(key, "the message list is empty")
    messages: Messages = []
    for i, message in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(message, dict):
            raise fail(where, f"a message must be an object with 'role' and 'content', got {json_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            raise fail(f"{where}.role", "a message needs a 'role' string (system, user, assistant)")
        content = _message_content(message.get("content"), f"{where}.content", fail)
        messages.append({"role": role.strip(), "content": content})
    return messages


def _message_content(raw: Any, where: str, fail: Callable[..., InputError]) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in raw):
        return "".join(p["text"] for p in raw)
    raise fail(where, f"a message needs 'content' as a string (or a list of text parts), got {json_kind(raw)}")


def _parse_targets(key: str, raw: Any, fail: Callable[..., InputError]) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    targets: list[str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise fail(key, f"expected a string or a list of strings, got {json_kind(item)}")
        targets.append(str(item))
    return tuple(targets)


def _append_choices(case_input: str | Messages, choices: Any, fail: Callable[..., InputError]) -> str | Messages:
    if (not isinstance(choices, list) or not 2 <= len(choices) <= len(_CHOICE_LETTERS)
            or not all(isinstance(c, str) for c in choices)):
        raise fail("choices", f"expected a list of 2 to {len(_CHOICE_LETTERS)} strings")
    listing = "\n".join(f"{letter}) {text}" for letter, text in zip(_CHOICE_LETTERS, choices))
    if isinstance(case_input, str):
        return f"{case_input}\n\n{listing}"
    messages = [dict(m) for m in case_input]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    messages[last_user]["content"] = f"{messages[last_user]['content']}\n\n{listing}"
    return messages


def _check_against_targets(check: Check, targets: tuple[str, ...], where: str,
                           fail: Callable[..., InputError]) -> None:
    """A check that leans on the target needs one, and one of the right kind."""
    if check.value is not None or check.type not in TARGET_TYPES:
        return
    if not targets:
        raise fail(f"{where}.value", f"'{check.type}' needs a 'value' when the case has no target")
    if check.type == "numeric" and all(parse_number(t) is None for t in targets):
        raise fail("target", f"a 'numeric' check needs a number as the target, got {list(targets)}")
    if check.type == "choice":
        letters = check.options.get("letters", "ABCDE")
        if all(choice_letter_of_target(t, letters) is None for t in targets):
            raise fail("target", f"a 'choice' check needs an answer letter ({letters}) as the target, "
                                 f"got {list(targets)}")
