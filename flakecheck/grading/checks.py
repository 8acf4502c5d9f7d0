"""Grading checks: parse a case's check objects and grade an output against them.

A check is `{"type": ..., "value": ..., **options}`. Canonical types (CHECK_TYPES); "(target)" marks the
types whose `value` may be left out, the case's targets standing in for it (any target may match):

- `exact` (target): the output equals the value after whitespace normalisation (strip, collapse runs);
  `normalize: "none"`: character for character (promptfoo's `equals`).
- `contains`, `icontains` (target): the value occurs in the output (`icontains`: ignoring case).
- `starts-with` (target): the output, leading whitespace removed, starts with the value.
- `regex` (needs a value): the pattern matches somewhere; when it has a capture group and the case has a
  target, the first group (whitespace-normalised) must equal a target. Option `ignore_case`.
- `numeric` (target): the first number in the output ("1,234.5", "-3", "2e5") is within `abs_tol` or
  `rel_tol` (default 1e-9) of the value.
- `choice` (target): the answer letter found in the output (see `extract_choice`) is the value's letter.
  Option `letters` (default "ABCDE").
- `json`: the output parses as JSON (whole, inside a ```json fence, or the one object/array in the text);
  `required`: keys the object must have; a dict `value`: key/value pairs it must contain (strings compared
  ignoring case and spacing). `whole: true`: only the whole output counts (promptfoo's `is-json`).
- `levenshtein` (needs a value): the edit distance between the output and the value is at most `threshold`
  (default 5), as promptfoo's `levenshtein` assertion.
- `contains-any`, `contains-all` (targets): any / all of the listed strings occur. Option `ignore_case`.
- `match` (target): inspect_ai's match() scorer. Options `location` (begin | end | any | exact, default end),
  `ignore_case` (default true), `numeric` (default false).
- `exact-match` (target): lm-evaluation-harness's exact_match metric after its filters. Options `filters`
  (a list of lm-eval filter steps: regex, take_first, remove_whitespace, lowercase, uppercase),
  `ignore_case`, `ignore_punctuation`, `ignore_numbers`, `regexes_to_ignore`.

The eval harnesses' other deterministic scorers are options of the types above: `exact` with
`normalize: "squad"` (inspect_ai's exact()), `regex` with `groups: "any" | "all"` (inspect_ai's pattern() and
answer(): a captured group, or the whole match, equals a target), `choice` with `format: "answer"` and
`multiple` (inspect_ai's multiple_choice() "ANSWER: X" parsing). Their rules are in flakecheck.grading.harness_rules.

Any type takes a `not-` prefix that inverts it. Also accepted: `equals` -> exact, `includes` -> contains,
`is-json` -> json, `pattern` / `matches` -> regex, `icontains-any` / `icontains-all` -> contains-any / -all
with ignore_case, underscores for hyphens (`starts_with`), any letter case (inspect_ai / promptfoo names).
A bare string is the same as `{"type": string}`; `contains-any` / `-all` also take a comma-separated string,
as promptfoo does. promptfoo's `metric`, `weight` and `description` keys are ignored.

Nothing here executes code from a suite: there are no `python` / `javascript` checks. Regexes run on the
`regex` engine with a time limit (REGEX_TIMEOUT_S); a regex check that runs out of time fails, negated or not,
because a check that could not be decided has not passed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import regex

from flakecheck.errors import InputError
from flakecheck.grading import harness_rules as harness

CHECK_TYPES: tuple[str, ...] = (
    "exact", "contains", "icontains", "starts-with", "regex", "numeric", "choice", "json",
    "contains-any", "contains-all", "match", "exact-match", "levenshtein",
)

# Spelling -> (canonical type, options it implies).
_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "equals": ("exact", {}),
    "equal": ("exact", {}),
    "includes": ("contains", {}),
    "startswith": ("starts-with", {}),
    "is-json": ("json", {}),
    "pattern": ("regex", {}),
    "matches": ("regex", {}),
    "icontains-any": ("contains-any", {"ignore_case": True}),
    "icontains-all": ("contains-all", {"ignore_case": True}),
}

# Types whose value may be omitted because the case target stands in for it.
TARGET_TYPES = frozenset({"exact", "contains", "icontains", "starts-with", "numeric", "choice",
                          "contains-any", "contains-all", "match", "exact-match"})

REGEX_TIMEOUT_S = 0.25
_KNOWN_OPTIONS = {
    "exact": {"normalize"},
    "numeric": {"abs_tol", "rel_tol"},
    "json": {"required", "whole"},
    "levenshtein": {"threshold"},
    "regex": {"ignore_case", "groups"},
    "contains-any": {"ignore_case"},
    "contains-all": {"ignore_case"},
    "choice": {"letters", "format", "multiple"},
    "match": {"location", "ignore_case", "numeric"},
    "exact-match": {"filters", "ignore_case", "ignore_punctuation", "ignore_numbers", "regexes_to_ignore"},
}
_BOOLEAN_OPTIONS = {"ignore_case", "numeric", "multiple", "ignore_punctuation", "ignore_numbers", "whole"}
_CHOICES = {"normalize": ("whitespace", "squad", "none"), "groups": ("first", "any", "all"),
            "format": ("letter", "answer"), "location": harness.LOCATIONS}
_IGNORED_KEYS = {"type", "value", "metric", "weight", "description"}  # promptfoo extras with no meaning here


@dataclass(frozen=True)
class Check:
    type: str
    value: Any
    negate: bool = False
    options: dict[str, Any] = field(default_factory=dict, hash=False)


def normalise_whitespace(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------- parsing


def parse_check(obj: Any, path: str, line: int, field: str) -> Check:
    """One check object from a suite line; InputError(path, line, field, ...) when it is not valid."""

    def fail(message: str, where: str = "") -> InputError:
        return InputError(path, line, field + where, message)

    if isinstance(obj, str):
        obj = {"type": obj}
    if not isinstance(obj, dict):
        raise fail(f"a check must be an object with a 'type', got {_json_type(obj)}")
    raw_type = obj.get("type")
    if not isinstance(raw_type, str) or not raw_type.strip():
        raise fail("a check needs a 'type' (one of: " + ", ".join(CHECK_TYPES) + ")", ".type")
    check_type, negate, implied = _canonical_type(raw_type)
    if check_type is None:
        raise fail(f"unknown check type '{raw_type}'; known types: " + ", ".join(CHECK_TYPES)
                   + " (each also with a 'not-' prefix)", ".type")
    options = dict(implied)
    for key, option in obj.items():
        if key in _IGNORED_KEYS:
            continue
        if key not in _KNOWN_OPTIONS.get(check_type, set()):
            raise fail(f"'{check_type}' does not take an option '{key}'", f".{key}")
        if key in _BOOLEAN_OPTIONS and not isinstance(option, bool):
            raise fail(f"'{key}' must be true or false", f".{key}")
        if key in _CHOICES and option not in _CHOICES[key]:
            raise fail(f"'{key}' must be one of {', '.join(_CHOICES[key])}, got {option!r}", f".{key}")
        options[key] = option
    if check_type == "exact-match":
        _check_lm_eval_options(options, fail)
    value = _parse_value(check_type, obj.get("value"), options, fail)
    return Check(check_type, value, negate, options)


def _check_lm_eval_options(options: dict[str, Any], fail: Any) -> None:
    ignore = options.get("regexes_to_ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise fail("'regexes_to_ignore' must be a list of regex strings", ".regexes_to_ignore")
    for pattern in ignore:
        _valid_regex(pattern, fail, ".regexes_to_ignore")
    filters = options.get("filters", [])
    if not isinstance(filters, list):
        raise fail("'filters' must be a list of lm-eval filter steps", ".filters")
    for i, step in enumerate(filters):
        where = f".filters[{i}]"
        if not isinstance(step, dict) or step.get("function") not in harness.LM_EVAL_FILTERS:
            raise fail("a filter step is an object whose 'function' is one of "
                       + ", ".join(harness.LM_EVAL_FILTERS), where)
        if step["function"] == "regex":
            _valid_regex(step.get("regex_pattern"), fail, f"{where}.regex_pattern")
            if isinstance(step.get("group_select", 0), bool) or not isinstance(step.get("group_select", 0), int):
                raise fail("'group_select' must be an integer", f"{where}.group_select")


def _valid_regex(pattern: Any, fail: Any, where: str) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise fail("expected a regex string", where)
    try:
        _compile(pattern, False)
    except regex.error as err:
        raise fail(f"invalid regex {pattern!r}: {err}", where) from None


def _canonical_type(raw: str) -> tuple[str | None, bool, dict[str, Any]]:
    name = raw.strip().lower().replace("_", "-")
    negate = name.startswith("not-")
    if negate:
        name = name[len("not-"):]
    if name in CHECK_TYPES:
        return name, negate, {}
    if name in _ALIASES:
        canonical, implied = _ALIASES[name]
        return canonical, negate, implied
    return None, negate, {}


def _parse_value(check_type: str, value: Any, options: dict[str, Any], fail: Any) -> Any:
    """Validate and normalise a check's value (and its options) for its type."""
    if check_type in ("exact", "contains", "icontains", "starts-with", "match", "exact-match"):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise fail(f"'{check_type}' takes a string value, got {_json_type(value)}", ".value")
        return str(value)
    if check_type == "regex":
        if not isinstance(value, str) or not value:
            raise fail("'regex' needs a pattern string as 'value'", ".value")
        if not isinstance(options.get("ignore_case", False), bool):
            raise fail("'ignore_case' must be true or false", ".ignore_case")
        try:
            _compile(value, bool(options.get("ignore_case", False)))
        except regex.error as err:
            raise fail(f"invalid regex {value!r}: {err}", ".value") from None
        return value
    if check_type == "numeric":
        for tol in ("abs_tol", "rel_tol"):
            if tol in options and not _is_non_negative_number(options[tol]):
                raise fail(f"'{tol}' must be a number >= 0, got {options[tol]!r}", f".{tol}")
        if value is None:
            return None
        number = value if _is_number(value) else (parse_number(value) if isinstance(value, str) else None)
        if number is None:
            raise fail(f"'numeric' takes a number, got {value!r}", ".value")
        return float(number)
    if check_type == "choice":
        letters = options.get("letters", _DEFAULT_LETTERS)
        if not isinstance(letters, str) or not re.fullmatch(r"[A-Z]+", letters):
            raise fail("'letters' must be a string of capital letters, e.g. \"ABCD\"", ".letters")
        if value is None:
            return None
        letter = choice_letter_of_target(value, letters) if isinstance(value, str) else None
        if letter is None:
            raise fail(f"'choice' takes an answer letter among {letters}, got {value!r}", ".value")
        return letter
    if check_type == "levenshtein":
        if "threshold" in options and not _is_non_negative_number(options["threshold"]):
            raise fail(f"'threshold' must be a number >= 0, got {options['threshold']!r}", ".threshold")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise fail("'levenshtein' needs a string 'value'", ".value")
        return str(value)
    if check_type == "json":
        required = options.get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise fail("'required' must be a list of key names", ".required")
        if value is not None and not isinstance(value, dict):
            raise fail(f"'json' takes an object of expected key/values as 'value', got {_json_type(value)}",
                       ".value")
        return value
    # contains-any / contains-all
    if not isinstance(options.get("ignore_case", False), bool):
        raise fail("'ignore_case' must be true or false", ".ignore_case")
    if value is None:
        return None
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail(f"'{check_type}' takes a non-empty list of strings", ".value")
    return tuple(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_non_negative_number(value: Any) -> bool:
    return _is_number(value) and value >= 0


@lru_cache(maxsize=512)
def _compile(pattern: str, ignore_case: bool) -> regex.Pattern[str]:
    return regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)


# ------------------------------------------------------------------------------------------- extractors

# Thousands separators only in groups of three, so "1,2,3" reads as 1 rather than 123.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])-?\.\d+")


def parse_number(text: str) -> float | None:
    """The first number in the text ("-1,234.5", "3e8", ".5"), or None."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    try:
        return float(match.group(0).replace(",", ""))
    except ValueError:  # cannot happen with the pattern above, but never let grading raise
        return None


_DEFAULT_LETTERS = "ABCDE"


def extract_choice(output: str, letters: str = _DEFAULT_LETTERS) -> str | None:
    """The answer letter of a multiple-choice output, or None.

    In order of trust: "Answer: B" / "the answer is (B)"; a parenthesised "(B)"; a line starting "B." / "B)" /
    "B:"; then the first standalone capital letter among `letters`, except an "A" followed by a lowercase word
    (the article, as in "A cat ...").
    """
    cls = f"[{letters}]"
    patterns = (
        rf"(?i:\banswer\b)\s*(?:(?i:is)\s+)?:?\s*\(?({cls})(?![A-Za-z0-9])",
        rf"\(({cls})\)",
        rf"(?m)^\s*\**({cls})\**\s*[.):]",
    )
    for pattern in patterns:
        match = re.search(pattern, output)
        if match:
            return match.group(1)
    for match in re.finditer(rf"(?<![A-Za-z0-9])({cls})(?![A-Za-z0-9])", output):
        if match.group(1) == "A" and re.match(r"\s+[a-z]", output[match.end():]):
            continue
        return match.group(1)
    return None


def choice_letter_of_target(target: str, letters: str = _DEFAULT_LETTERS) -> str | None:
    """A target such as "B", "(B)", "b" or "B. Paris" as its letter."""
    stripped = target.strip()
    if len(stripped) == 1 and stripped.upper() in letters:
        return stripped.upper()
    return extract_choice(stripped, letters)


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def parse_json_output(output: str) -> tuple[bool, Any]:
    """(parsed, value): the whole output, else the first ``` fence, else the span from the first '{' or '['
    to the last matching bracket."""
    candidates = [output.strip()]
    fence = _FENCE.search(output)
    if fence:
        candidates.append(fence.group(1).strip())
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = output.find(opener), output.rfind(closer)
        if 0 <= start < end:
            candidates.append(output[start:end + 1])
    for text in candidates:
        try:
            return True, json.loads(text)
        except (ValueError, RecursionError):  # a model repeating "[[[[" nests past the recursion limit
            continue
    return False, None


# ---------------------------------------------------------------------------------------------- grading


class _Undecided(Exception):
    """A check that could not be decided (a regex out of time): it fails, negated or not."""


def grade(output: str, checks: Sequence[Check], targets: Sequence[str]) -> bool | None:
    """True when every check passes; without checks, whitespace-normalised equality with any target;
    None when there is nothing to grade against."""
    if checks:
        return all(check_passes(output, check, targets) for check in checks)
    if targets:
        normalised = normalise_whitespace(output)
        return any(normalised == normalise_whitespace(t) for t in targets)
    return None


def check_passes(output: str, check: Check, targets: Sequence[str]) -> bool:
    try:
        return _evaluate(output, check, targets) != check.negate
    except _Undecided:
        return False


def _evaluate(output: str, check: Check, targets: Sequence[str]) -> bool:
    kind = check.type
    if kind == "regex":
        return _regex_passes(output, check, targets)
    if kind == "json":
        return _json_passes(output, check)
    if kind == "levenshtein":
        return edit_distance(output, check.value) <= float(check.options.get("threshold", 5))
    if kind in ("contains-any", "contains-all"):
        needles = check.value if check.value is not None else tuple(targets)
        if not needles:
            return False
        haystack = output
        if check.options.get("ignore_case"):
            haystack, needles = output.casefold(), tuple(n.casefold() for n in needles)
        found = (needle in haystack for needle in needles)
        return any(found) if kind == "contains-any" else all(found)
    expected = [check.value] if check.value is not None else list(targets)
    if kind in ("match", "exact-match"):
        return _harness_passes(output, check, [str(e) for e in expected])
    if kind == "numeric":
        return _numeric_passes(output, check, expected)
    if kind == "choice":
        letters = check.options.get("letters", _DEFAULT_LETTERS)
        if check.options.get("format") == "answer":
            wanted_letters = harness.target_letters([str(e) for e in expected])
            return harness.answer_letters(output, letters, bool(check.options.get("multiple"))) == wanted_letters
        answer = extract_choice(output, letters)
        wanted = {choice_letter_of_target(e, letters) if isinstance(e, str) else None for e in expected}
        return answer is not None and answer in wanted
    expected_texts = [str(e) for e in expected]
    if kind == "exact":
        if check.options.get("normalize") == "squad":
            return harness.squad_exact(output, expected_texts)
        if check.options.get("normalize") == "none":
            return output in expected_texts
        normalised = normalise_whitespace(output)
        return any(normalised == normalise_whitespace(e) for e in expected_texts)
    if kind == "contains":
        return any(e in output for e in expected_texts)
    if kind == "icontains":
        folded = output.casefold()
        return any(e.casefold() in folded for e in expected_texts)
    if kind == "starts-with":
        return any(output.lstrip().startswith(e.lstrip()) for e in expected_texts)
    raise ValueError(f"unknown check type {kind!r}")  # parse_check admits only CHECK_TYPES


def _harness_passes(output: str, check: Check, expected: list[str]) -> bool:
    options = check.options
    try:
        if check.type == "match":
            return any(harness.inspect_match(output, e, options.get("location", "end"),
                                             options.get("ignore_case", True), options.get("numeric", False))
                       for e in expected)
        prediction = harness.lm_eval_filter(output, options.get("filters", []), REGEX_TIMEOUT_S)
        return any(harness.lm_eval_exact(prediction, e, options, REGEX_TIMEOUT_S) for e in expected)
    except harness.RegexTimeout:
        raise _Undecided from None


def _regex_passes(output: str, check: Check, targets: Sequence[str]) -> bool:
    pattern = _compile(check.value, bool(check.options.get("ignore_case", False)))
    try:
        match = pattern.search(output, timeout=REGEX_TIMEOUT_S)
    except TimeoutError:
        raise _Undecided from None
    if match is None:
        return False
    if check.options.get("groups") in ("any", "all"):
        return bool(targets) and harness.pattern_groups_match(match, targets, bool(check.options.get("ignore_case")),
                                                              check.options["groups"] == "all")
    if pattern.groups and targets:
        captured = normalise_whitespace(match.group(1) or "")
        return any(captured == normalise_whitespace(t) for t in targets)
    return True


def _numeric_passes(output: str, check: Check, expected: Sequence[Any]) -> bool:
    got = parse_number(output)
    if got is None:
        return False
    abs_tol = float(check.options.get("abs_tol", 0.0))
    rel_tol = float(check.options.get("rel_tol", 1e-9))
    for e in expected:
        want = float(e) if _is_number(e) else (parse_number(e) if isinstance(e, str) else None)
        if want is not None and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol):
            return True
    return False


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of one character each)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _json_passes(output: str, check: Check) -> bool:
    if check.options.get("whole"):
        try:
            parsed, data = True, json.loads(output)
        except (ValueError, RecursionError):
            parsed, data = False, None
    else:
        parsed, data = parse_json_output(output)
    if not parsed:
        return False
    required: list[str] = check.options.get("required", [])
    wanted: dict[str, Any] = check.value or {}
    if required or wanted:
        if not isinstance(data, dict):
            return False
        if any(key not in data for key in required):
            return False
        return all(key in data and _json_equal(data[key], value) for key, value in wanted.items())
    return True


def _json_equal(got: Any, want: Any) -> bool:
    # Strings compare after whitespace normalisation and case folding: "New York" vs "new york " is the same
    # extracted value for an eval's purposes; everything else compares as JSON values.
    # A number and a numeric string ("34" vs 34) are the same extracted value too.
    if isinstance(got, str) and isinstance(want, str):
        return normalise_whitespace(got).casefold() == normalise_whitespace(want).casefold()
    if _is_number(got) and isinstance(want, str) or _is_number(want) and isinstance(got, str):
        text, number = (want, got) if _is_number(got) else (got, want)
        whole = _NUMBER.fullmatch(text.strip())
        return whole is not None and math.isclose(float(whole.group(0).replace(",", "")), number)
    if isinstance(got, bool) != isinstance(want, bool):  # JSON true is not 1
        return False
    return bool(got == want)


# ----------------------------------------------------------------------------------------------- labels


def check_label(check: Check) -> str:
    """Short human text for reports: "not-contains 'foo'", "numeric 42 (abs_tol 0.5)", "choice (target)"."""
    name = ("not-" if check.negate else "") + check.type
    if check.value is None:
        detail = "(target)" if check.type in TARGET_TYPES else ""
    elif check.type == "numeric":
        detail = f"{check.value:g}"
    elif isinstance(check.value, tuple):
        detail = "[" + ", ".join(_short(v) for v in check.value) + "]"
    elif isinstance(check.value, dict):
        detail = _short(json.dumps(check.value, ensure_ascii=False), 40)
    else:
        detail = _short(str(check.value))
    extras = []
    for key in ("abs_tol", "rel_tol", "threshold"):
        if key in check.options:
            extras.append(f"{key} {check.options[key]:g}")
    if check.options.get("required"):
        extras.append("required " + ", ".join(check.options["required"]))
    if check.options.get("ignore_case") and check.type not in ("icontains",):
        extras.append("ignore case")
    for key in ("normalize", "groups", "format", "location"):
        if key in check.options:
            extras.append(f"{key} {check.options[key]}")
    if check.options.get("numeric"):
        extras.append("numeric")
    if check.options.get("filters"):
        extras.append("filters " + ", ".join(str(f["function"]) for f in check.options["filters"]))
    text = f"{name} {detail}".rstrip()
    return f"{text} ({'; '.join(extras)})" if extras else text


def _short(text: str, limit: int = 30) -> str:
    # Quoted but not repr()-escaped, so a regex reads as written; newlines shown as \n to keep one line.
    flat = text.replace("\n", "\\n")
    clipped = flat if len(flat) <= limit else flat[: limit - 1] + "…"
    return f"'{clipped}'"
