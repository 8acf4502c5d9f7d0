"""The harness's scorer as flakecheck checks, where its rule is a deterministic text rule flakecheck has:

| harness | scorer | check |
|---|---|---|
| inspect_ai | includes(ignore_case) | icontains (contains when ignore_case is false) |
| inspect_ai | match(location, ignore_case, numeric) | match |
| inspect_ai | exact() | exact, normalize squad |
| inspect_ai | pattern(pattern, ignore_case, match_all) | regex, groups any (all) |
| inspect_ai | answer(letter / word / line) | regex with inspect's ANSWER pattern, groups any |
| inspect_ai | choice() (multiple_choice solver, choices not shuffled) | choice, format answer |
| lm-eval | exact_match after regex / take_first / remove_whitespace / lowercase / uppercase filters | exact-match |

Anything else is not mapped and the import says why (model-graded scorers need a model; a custom scorer's
code is not in the log, and flakecheck never runs suite code): its verdicts are still recorded from the log,
and a replay is graded through `--grader` (see docs/import.md). Mapped checks only read text; their regexes
run under flakecheck.grading.checks' time bound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakecheck.grading.harness_rules import LM_EVAL_FILTERS
from flakecheck.harness.model import HarnessLog, SampleRun, ScorerSpec

# inspect_ai 0.3.285's ANSWER patterns (inspect_ai/_util/pattern.py)
ANSWER_PATTERNS = {
    "letter": r"(?is)ANSWER\s*:\s*([A-Za-z])(?:[^\w]|\n|$)(?!.*ANSWER\s*:)",
    "word": r"(?is)ANSWER\s*:\s*(\S+?)(?=[.,;:!?]?\s*(?:\n|$))(?!.*ANSWER\s*:)",
    "line": r"(?i)ANSWER\s*:\s*([^\n]+)\s*\Z",
}
INSPECT_MAPPED = ("includes", "match", "exact", "pattern", "answer", "choice")
LM_EVAL_MAPPED = ("exact_match",)
_LM_EVAL_METRIC_OPTIONS = {"ignore_case", "ignore_punctuation", "ignore_numbers", "regexes_to_ignore"}
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class ScorerMapping:
    scorer: str | None
    mapped: bool
    note: str  # what it maps to, or why it is not mapped
    template: list[dict[str, Any]] | None = None  # the checks; a choice check gets its letters per sample

    def checks_for(self, sample: SampleRun) -> list[dict[str, Any]] | None:
        if self.template is None:
            return None
        checks = [dict(c) for c in self.template]
        n_choices = sample.metadata.get("n_choices")
        for check in checks:
            if check["type"] == "choice" and isinstance(n_choices, int) and n_choices > 0:
                check["letters"] = _LETTERS[:n_choices]
        return checks

    def to_dict(self) -> dict[str, Any]:
        return {"scorer": self.scorer, "mapped": self.mapped, "note": self.note, "checks": self.template}


def map_scorer(log: HarnessLog) -> ScorerMapping:
    spec = log.scorer
    if spec is None:
        return ScorerMapping(None, False, "the log names no scorer")
    mapper = _inspect if log.harness == "inspect_ai" else _lm_eval
    checks, note = mapper(spec)
    return ScorerMapping(spec.name, checks is not None, note, checks)


def _inspect(spec: ScorerSpec) -> tuple[list[dict[str, Any]] | None, str]:
    name, options = spec.name.removeprefix("inspect_ai/"), spec.params
    unknown = set(options) - _INSPECT_OPTIONS.get(name, set())
    if name in INSPECT_MAPPED and unknown:
        return None, f"{name}() with option(s) {', '.join(sorted(unknown))} flakecheck does not know: not mapped"
    if name == "includes":
        kind = "icontains" if options.get("ignore_case", True) else "contains"
        return [{"type": kind}], f"includes() -> {kind} (target)"
    if name == "match":
        check = {"type": "match", "location": options.get("location", "end"),
                 "ignore_case": bool(options.get("ignore_case", True)), "numeric": bool(options.get("numeric", False))}
        return [check], "match() -> match (target)"
    if name == "exact":
        return [{"type": "exact", "normalize": "squad"}], "exact() -> exact, normalize squad (target)"
    if name in ("pattern", "answer"):
        if name == "answer":
            kind = options.get("pattern")
            if kind not in ANSWER_PATTERNS:
                return None, f"answer(pattern={kind!r}): not a pattern inspect_ai defines; not mapped"
            pattern, ignore_case, every = ANSWER_PATTERNS[kind], True, False
        else:
            pattern = options.get("pattern")
            if not isinstance(pattern, str) or not pattern:
                return None, "pattern() without a pattern string in the log: not mapped"
            ignore_case, every = bool(options.get("ignore_case", True)), bool(options.get("match_all", False))
        check = {"type": "regex", "value": pattern, "ignore_case": ignore_case, "groups": "all" if every else "any"}
        return [check], f"{name}() -> regex, groups {'all' if every else 'any'} (target)"
    if name == "choice":
        solver = options.get("_multiple_choice")
        if not isinstance(solver, dict):
            return None, "choice() without the multiple_choice solver in the plan: not mapped"
        if solver.get("shuffle"):
            return None, ("choice() with shuffled choices: the letters the model saw are not the target's; "
                          "not mapped")
        check = {"type": "choice", "format": "answer", "multiple": bool(solver.get("multiple_correct"))}
        return [check], "choice() -> choice, format answer (target letters)"
    if name.startswith("model_graded") or "model" in options or "grader" in name:
        return None, f"{name}(): graded by a model; not mapped (grade a replay with --grader)"
    if name == "f1":
        return None, "f1(): a score between 0 and 1, not a pass/fail rule; not mapped"
    return None, f"{name}(): a custom scorer (its code is not in the log, and flakecheck runs no suite code); " \
                 "not mapped (grade a replay with --grader)"


_INSPECT_OPTIONS = {
    "includes": {"ignore_case"},
    "match": {"location", "ignore_case", "numeric"},
    "exact": set(),
    "pattern": {"pattern", "ignore_case", "match_all"},
    "answer": {"pattern"},
    "choice": {"_multiple_choice"},
}


def _lm_eval(spec: ScorerSpec) -> tuple[list[dict[str, Any]] | None, str]:
    options = spec.params
    if spec.name not in LM_EVAL_MAPPED:
        return None, f"{spec.name}: an lm-eval metric flakecheck does not map (only exact_match); grade a replay " \
                     "with --grader"
    if not options.get("config_found"):
        return None, "exact_match: the task's filters and metric options are unknown (no results_*.json beside " \
                     "the samples file); not mapped"
    steps = options.get("filter_steps")
    if steps is None:
        steps = [{"function": "take_first"}] if options.get("filter") == "none" else None
    if steps is None:
        return None, f"exact_match: filter '{options.get('filter')}' is not in the task's config; not mapped"
    filters = []
    for step in steps:
        kind = step.get("function") if isinstance(step, dict) else None
        if kind not in LM_EVAL_FILTERS:
            return None, f"exact_match after filter '{kind}': that filter is not mapped"
        filters.append({k: v for k, v in step.items() if k in ("function", "regex_pattern", "group_select",
                                                                   "fallback")})
    metric = options.get("metric_options") or {}
    unknown = set(metric) - _LM_EVAL_METRIC_OPTIONS
    if unknown:
        return None, f"exact_match with option(s) {', '.join(sorted(unknown))}: not mapped"
    check: dict[str, Any] = {"type": "exact-match", **{k: metric[k] for k in sorted(metric)}}
    if filters:
        check["filters"] = filters
    return [check], f"exact_match after filter '{options.get('filter')}' -> exact-match (target)"
