"""The grading rules of the eval harnesses' deterministic text scorers, so an imported suite grades its
replays as the harness graded the original run (flakecheck.grading.checks dispatches to these):

- `match` (inspect_ai's `match()`): the target at the `location` (begin | end | any | exact) of the output,
  after stripping whitespace and punctuation, case folded unless `ignore_case` is false; with `numeric`, the
  first (begin) / last (end) / any number of the output against a numeric target, both normalised to 5
  significant digits, currency signs, thousands separators and `*`/`_` markers removed.
- `exact` with `normalize: "squad"` (inspect_ai's `exact()`): equality after SQuAD-style normalisation
  (case folded, punctuation and the articles a/an/the removed, numbers as floats, whitespace collapsed).
- `regex` with `groups: "any" | "all"` (inspect_ai's `pattern()` and `answer()`): any (all) captured group,
  or the whole match when the pattern has no group, equals a target (case folded with `ignore_case`).
- `choice` with `format: "answer"` (inspect_ai's `multiple_choice()` solver with the `choice()` scorer): the
  letters of the last "ANSWER: ..." line, as that solver parses them, equal the target letters.
- `exact-match` (lm-evaluation-harness's `exact_match` metric after the task's filters): the filters
  (`regex` with `regex_pattern`, `group_select`, `fallback`; `take_first`; `remove_whitespace`; `lowercase`;
  `uppercase`) turn the output into the prediction, which must equal the target after `regexes_to_ignore`,
  `ignore_case`, `ignore_punctuation` and `ignore_numbers`, with no other normalisation.

Ported from inspect_ai 0.3.285 and lm-eval 0.4.13 (only the rules, not the code paths that run model or user
code). Known difference: inspect's numeric `match` also reads numbers in other scripts (Chinese numerals,
vulgar fractions, full-width digits); here only what Python's float() reads is a number. Every regex from a
suite runs under the time bound of flakecheck.grading.checks (RegexTimeout when it runs out).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from typing import Any

import regex

LOCATIONS = ("begin", "end", "any", "exact")
LM_EVAL_FILTERS = ("regex", "take_first", "remove_whitespace", "lowercase", "uppercase")


class RegexTimeout(Exception):
    """A suite regex ran past its time bound: the check cannot be decided."""


def search(pattern: str, text: str, flags: int, timeout: float) -> regex.Match[str] | None:
    try:
        return regex.search(pattern, text, flags, timeout=timeout)
    except TimeoutError:
        raise RegexTimeout from None


# ------------------------------------------------------------------------------------------ inspect: match

_NUMERIC_TRIM = "!?:;()[]{}'\"`"


def _strip_punctuation(text: str) -> str:
    return text.strip(string.whitespace + string.punctuation)


def _strip_numeric_punctuation(text: str) -> str:
    text = re.sub(r"\\([$,£,€*_])", r"\1", text)
    text = re.sub(r"[$,£,€,*,_]", "", text)
    return re.sub(r"\.(?=\s|$|\D)", "", text)


def _parse_number(text: str, trim: bool = True) -> float | None:
    cleaned = text.strip(_NUMERIC_TRIM) if trim else text
    try:
        number = float(cleaned)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _normalize_number(text: str, trim: bool = True) -> str:
    number = _parse_number(text, trim)
    return text if number is None else format(number, ".5g")


def inspect_match(output: str, target: str, location: str, ignore_case: bool, numeric: bool) -> bool:
    """inspect_ai's match_str(): does `target` sit at `location` in `output`?"""
    value, wanted = output.strip(), target.strip()
    if ignore_case:
        value, wanted = value.casefold(), wanted.casefold()
    if numeric:
        wanted = _strip_numeric_punctuation(wanted)
    if numeric and _parse_number(wanted) is not None:
        value = _strip_numeric_punctuation(value)
        wanted = _normalize_number(wanted)
        words = re.split(r"\s+", value)
        if location == "exact":
            return _normalize_number(value, trim=False) == wanted
        numbers = [_normalize_number(w) for w in words if _parse_number(w) is not None]
        if location == "any":
            return wanted in numbers
        if not numbers:
            return False
        return (numbers[0] if location == "begin" else numbers[-1]) == wanted
    value, wanted = _strip_punctuation(value), _strip_punctuation(wanted)
    if location == "begin":
        return value.startswith(wanted)
    if location == "end":
        return value.endswith(wanted)
    if location == "exact":
        return value == wanted
    return wanted in value


# ------------------------------------------------------------------------------------------ inspect: exact

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def _is_finite_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _remove_punctuation(token: str) -> str:
    if _is_finite_number(token):
        return token
    stripped = _strip_punctuation(token)
    if _is_finite_number(stripped):
        return stripped
    return "".join(ch for ch in token if ch not in string.punctuation)


def _normalize_token(token: str) -> str:
    token = _remove_punctuation(token.casefold())
    token = str(float(token)) if _is_finite_number(token) else token
    token = _ARTICLES.sub(" ", token)
    return " ".join(token.split())


def squad_normalize(text: str) -> str:
    """inspect_ai's exact() normalisation of an answer or a target."""
    tokens = [_normalize_token(t) for t in re.split(" |-", text)]
    return " ".join(t for t in tokens if t.strip()).strip()


def squad_exact(output: str, targets: Sequence[str]) -> bool:
    answer = squad_normalize(output)
    return any(wanted and wanted == answer for wanted in (squad_normalize(t) for t in targets))


# ---------------------------------------------------------------------------------------- inspect: pattern

def pattern_groups_match(match: regex.Match[str], targets: Sequence[str], ignore_case: bool, every: bool) -> bool:
    """inspect_ai's pattern(): any (every) captured group, or the whole match without groups, is a target."""
    groups = match.groups() or (match.group(0),)
    wanted = {t.lower() if ignore_case else t for t in targets}
    found = [g.lower() if ignore_case else g for g in groups if isinstance(g, str)]
    if every:
        return bool(found) and all(g in wanted for g in found)
    return any(g in wanted for g in found)


# ----------------------------------------------------------------------------------------- inspect: choice

def answer_letters(output: str, letters: str, multiple: bool) -> set[str]:
    """The letters inspect_ai's multiple_choice() solver reads from "ANSWER: ..." (an empty set: none)."""
    text = re.sub(r"\x24\s*([A-Za-z\d][A-Za-z\d ,]*?)\s*\x24", r"\1", output)
    text = re.sub(r"\*\*\s*([A-Za-z\d][A-Za-z\d ,]*?)\s*\*\*", r"\1", text)
    text = re.sub(r"(?i)(^|[:,])(\s*)\(([A-Za-z\d])\)(?=\s*(?:,|\.|\n|\Z))", r"\1\2\3", text)
    matches = re.findall(r"(?i)^ANSWER\s*:\s*([A-Za-z\d ,]+)\s*(?:$|\n|\.)", text, flags=re.MULTILINE)
    if not matches:
        matches = re.findall(r"(?i)ANSWER\s*:\s*([A-Za-z\d ,]+)(?:[^\w]|\n|$|\.)", text)
    if not matches:
        return set()
    chosen = matches[-1].strip().rstrip(".").upper()
    allowed = set(letters)
    if multiple:
        chosen = chosen.replace(" AND ", ",").replace(" ", "")
        by_comma = {x for x in chosen.split(",") if x}
        if by_comma <= allowed:
            return by_comma
        return set(chosen) if set(chosen) <= allowed else set()
    tokens = [t for t in chosen.split(",") if t]
    return {tokens[0]} if len(tokens) == 1 and tokens[0] in allowed else set()


def target_letters(targets: Sequence[str]) -> set[str]:
    """The choice scorer's reading of a target: "A", "A,C", "A C" or "AC" are letters."""
    found: set[str] = set()
    for target in targets:
        for token in target.replace(",", " ").split():
            found.update([token] if token.isnumeric() else [c.upper() for c in token])
    return found


# ------------------------------------------------------------------------------------ lm-eval: exact_match

def lm_eval_filter(output: str, filters: Sequence[dict[str, Any]], timeout: float) -> str:
    """The prediction lm-eval scores: `output` through the task's filter pipeline (one response per doc, so
    take_first keeps it)."""
    value = output
    for step in filters:
        kind = step["function"]
        if kind == "regex":
            value = _regex_filter(value, step, timeout)
        elif kind == "remove_whitespace":
            value = value.strip()
        elif kind == "lowercase":
            value = value.lower()
        elif kind == "uppercase":
            value = value.upper()
    return value


def _regex_filter(value: str, step: dict[str, Any], timeout: float) -> str:
    fallback = str(step.get("fallback", "[invalid]"))
    try:
        found = regex.findall(str(step.get("regex_pattern", r"#### (\-?[0-9\.\,]+)")), value, timeout=timeout)
    except TimeoutError:
        raise RegexTimeout from None
    if not found:
        return fallback
    try:
        picked = found[int(step.get("group_select", 0))]
    except IndexError:  # lm-eval raises here and the run fails; a replay that cannot extract has not passed
        return fallback
    if isinstance(picked, tuple):
        parts = [p for p in picked if p]
        picked = parts[0] if parts else fallback
    return picked.strip()


def lm_eval_exact(prediction: str, reference: str, options: dict[str, Any], timeout: float) -> bool:
    """lm-eval's exact_match_hf_evaluate for one prediction and one reference."""
    for pattern in options.get("regexes_to_ignore") or []:
        try:
            prediction = regex.sub(pattern, "", prediction, timeout=timeout)
            reference = regex.sub(pattern, "", reference, timeout=timeout)
        except TimeoutError:
            raise RegexTimeout from None
    if options.get("ignore_case"):
        prediction, reference = prediction.lower(), reference.lower()
    if options.get("ignore_punctuation"):
        table = str.maketrans("", "", string.punctuation)
        prediction, reference = prediction.translate(table), reference.translate(table)
    if options.get("ignore_numbers"):
        table = str.maketrans("", "", string.digits)
        prediction, reference = prediction.translate(table), reference.translate(table)
    return prediction == reference
