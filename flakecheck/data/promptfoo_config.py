"""A promptfoo config (`promptfooconfig.yaml`) as suite lines: its prompts × tests, expanded as promptfoo
expands them, each a line that flakecheck.data.suite parses like a JSONL line.

- `prompts`: a string, a list of strings, `{raw, label}` / `{id, label}` objects, or `file://` paths (.txt, .md,
  .j2: text, several prompts separated by a line `---`; .json: chat messages). A rendered prompt that parses as
  a JSON list of `{role, content}` is chat messages; any other text is one user message (what promptfoo's
  OpenAI chat provider sends), or a raw completion prompt when the first provider is an `openai:completion:`.
- `tests`: inline objects, `file://` CSV (columns are vars; `__expected`, `__expected2`, ... assertions in
  promptfoo's `type: value` string form; `__description`), YAML (a list) or JSONL files, or a list mixing them.
  A var whose value is a list makes one test per combination, as promptfoo does. A var `file://x.txt` is the
  file's text.
- `defaultTest`: its vars under each test's, its assertions before each test's.
- The first provider's `config.max_tokens` becomes every case's max_tokens.

Variables are rendered with jinja2's SandboxedEnvironment, which reads Nunjucks' common syntax (`{{ var }}`,
`{% if %}`, `{% for %}`, filters such as `upper`, `trim`, `join`, `default`, and `dump` as JSON). Not covered:
JavaScript method calls inside a template (`{{ name.toUpperCase() }}`), Nunjucks-only filters and a config's
`nunjucksFilters` (JavaScript: never run), regex literals `r/.../`; such a template is an error naming the prompt.

Assertions map to flakecheck.grading.checks where the rule is the same text rule (ASSERTIONS). An assertion
that runs code (`javascript`, `python`, `webhook`, a `transform`) or a model (`llm-rubric`, `model-graded-*`,
`factuality`, `similar`, ...) is never executed: the case keeps no checks (promptfoo passes a test only when
all its assertions pass, so a partial grade would not be promptfoo's) and `metadata.ungraded` says which
assertion; `--grader CMD` can supply verdicts.

Case ids follow promptfoo's test × prompt: the test's `description` (made unique with `#N` when repeated) or
`test-N` (1-based, after expansion), and with more than one prompt ` [label]` (the prompt's label when short,
else `prompt-K`).

The YAML is read with a safe loader only. Every problem is an InputError naming the file, the line (of the
test in the config where known) and the field."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex
import yaml
from jinja2 import TemplateError
from jinja2.sandbox import SandboxedEnvironment

from flakecheck.errors import InputError

CONFIG_SUFFIXES = (".yaml", ".yml")
LABEL_MAX = 40
CODE_ASSERTIONS = frozenset({"javascript", "python", "webhook", "ruby", "fn", "eval"})
MODEL_ASSERTIONS = frozenset({"llm-rubric", "factuality", "similar", "answer-relevance", "context-faithfulness",
                              "context-recall", "context-relevance", "g-eval", "classifier", "moderation",
                              "select-best", "max-score", "human", "conversation-relevance", "pi", "search-rubric"})
# promptfoo type -> flakecheck check type (the value passes through); see _map_assertion for the rest
ASSERTIONS = {"contains": "contains", "icontains": "icontains", "contains-any": "contains-any",
              "contains-all": "contains-all", "icontains-any": "icontains-any", "icontains-all": "icontains-all",
              "regex": "regex", "levenshtein": "levenshtein"}
MAPPED = (*ASSERTIONS, "equals", "starts-with", "is-json", "contains-json")
_TEXT_FILES = (".txt", ".md", ".j2", ".njk", ".prompt")


@dataclass
class PromptfooSuite:
    """The config's cases as suite lines (with the line each came from), the bytes they depend on, warnings."""

    lines: list[tuple[int, dict[str, Any]]]
    digest: str
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Prompt:
    template: str
    label: str
    chat_json: bool  # from a .json file: always chat messages


class _Mapping(dict):  # a YAML mapping that remembers its line
    line: int | None = None


class _LineLoader(yaml.SafeLoader):
    """The safe loader, its mappings remembering their lines."""


def _line_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _line_mapping)


def is_promptfoo_config(path: Path) -> bool:
    return path.suffix.lower() in CONFIG_SUFFIXES


def prompt_part(label: str | None, index: int) -> str:
    """A prompt's part of a case id: its label when short and on one line, else `prompt-K` (1-based)."""
    text = (label or "").strip()
    return text if text and len(text) <= LABEL_MAX and "\n" not in text else f"prompt-{index + 1}"


def case_id(description: str | None, test_index: int, prompt_label: str | None, prompt_index: int,
            n_prompts: int, repeated: bool = False) -> str:
    test = (description.strip() if description and description.strip() else f"test-{test_index + 1}")
    if repeated and description:
        test = f"{test} #{test_index + 1}"
    return test if n_prompts == 1 else f"{test} [{prompt_part(prompt_label, prompt_index)}]"


def chat_messages(text: str) -> list[dict[str, str]] | None:
    """The rendered prompt as chat messages when it is a JSON list of {role, content} (promptfoo's chat format)."""
    stripped = text.strip()
    if not stripped.startswith("["):
        return None
    try:
        data = json.loads(stripped)
    except ValueError:
        return None
    if isinstance(data, list) and data and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                               and isinstance(m.get("content"), str) for m in data):
        return [{"role": m["role"], "content": m["content"]} for m in data]
    return None


def read_promptfoo_config(path: Path, data: bytes) -> PromptfooSuite:
    name = str(path)
    try:
        config = yaml.load(data.decode("utf-8"), Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError as err:
        raise InputError(name, None, None, f"not UTF-8 (byte 0x{data[err.start]:02x})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(name, mark.line + 1 if mark else None, None,
                         f"not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(config, dict):
        raise InputError(name, None, None, "a promptfoo config is a mapping with `prompts` and `tests`")
    digest = hashlib.sha256(data)
    base = path.parent
    warnings: list[str] = []

    def fail(line: int | None, where: str, message: str) -> InputError:
        return InputError(name, line, where, message)

    def read_file(ref: str, where: str, line: int | None) -> tuple[Path, str]:
        target = (base / ref.removeprefix("file://")).resolve()
        try:
            raw = target.read_bytes()
        except OSError as exc:
            raise fail(line, where, f"cannot read {target}: {exc.strerror or exc}") from None
        digest.update(raw)
        return target, raw.decode("utf-8", errors="replace")

    prompts = _prompts(config.get("prompts"), read_file, fail)
    max_tokens, completion = _provider(config.get("providers"), warnings, fail)
    default = config.get("defaultTest") or {}
    if not isinstance(default, dict):
        raise fail(None, "defaultTest", "expected a mapping (a `file://` defaultTest is not read)")
    tests = _expand(_tests(config.get("tests"), read_file, fail), fail)
    if not tests:
        raise fail(None, "tests", "the config has no tests")
    env = environment()
    descriptions = [t.get("description") for t, _, _ in tests]
    lines: list[tuple[int, dict[str, Any]]] = []
    for index, (test, line, where) in enumerate(tests):
        merged_vars = {**(default.get("vars") or {}), **(test.get("vars") or {})}
        merged_vars = {k: _var_value(v, read_file, f"{where}.vars.{k}", line, fail) for k, v in merged_vars.items()}
        asserts = [*(default.get("assert") or []), *(test.get("assert") or [])]
        checks, ungraded = map_assertions(asserts, {**default, **test}, env, merged_vars, f"{where}.assert", line, fail)
        description = test.get("description")
        repeated = description is not None and descriptions.count(description) > 1
        for k, prompt in enumerate(prompts):
            rendered = _render(env, prompt.template, merged_vars, fail, line, f"prompts[{k}]")
            messages = chat_messages(rendered)
            if prompt.chat_json and messages is None:
                raise fail(line, f"prompts[{k}]", "a .json prompt must render to a JSON list of {role, content}")
            obj: dict[str, Any] = {"id": case_id(str(description) if description is not None else None, index,
                                                 prompt.label, k, len(prompts), repeated)}
            if messages is not None:
                obj["messages"] = messages
            elif completion:
                obj["prompt"] = rendered
            else:
                obj["messages"] = [{"role": "user", "content": rendered}]
            if checks:
                obj["assert"] = checks
            if max_tokens is not None:
                obj["max_tokens"] = max_tokens
            obj["metadata"] = {"promptfoo": {"test_index": index, "prompt_index": k, "prompt_label": prompt.label,
                                             "description": description, "vars": _plain(merged_vars)},
                               **({"ungraded": ungraded} if ungraded else {})}
            lines.append((line or index + 1, obj))
    return PromptfooSuite(lines, digest.hexdigest(), warnings)


# ---------------------------------------------------------------------------------------------- parts


def environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True)
    env.filters["dump"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return env


def _render(env: SandboxedEnvironment, template: str, variables: dict[str, Any], fail: Callable[..., InputError],
            line: int | None, where: str) -> str:
    try:
        return env.from_string(template).render(**variables)
    except TemplateError as exc:
        raise fail(line, where, f"the template cannot be rendered as Nunjucks through jinja2's sandbox: {exc} "
                   "(JavaScript calls and Nunjucks-only filters are not supported)") from None


def _prompts(raw: Any, read_file: Callable[..., tuple[Path, str]], fail: Callable[..., InputError]) -> list[Prompt]:
    if raw is None:
        raise fail(None, "prompts", "the config has no prompts")
    items = raw if isinstance(raw, list) else [raw]
    prompts: list[Prompt] = []
    for i, item in enumerate(items):
        where = f"prompts[{i}]"
        line = getattr(item, "line", None)
        label = None
        if isinstance(item, dict):
            label = item.get("label")
            item = item.get("raw", item.get("id"))
        if not isinstance(item, str) or not item.strip():
            raise fail(line, where, "a prompt is a string, a `file://` path or an object with `raw` (or `id`)")
        if item.startswith("file://"):
            suffix = Path(item).suffix.lower()
            if suffix != ".json" and suffix not in _TEXT_FILES:
                raise fail(line, where, f"{suffix or 'this'} prompt files are not read (a .js or .py prompt "
                           "function is code, which flakecheck never runs); use .txt, .md, .j2 or .json")
            text = read_file(item, where, line)[1]
            if suffix == ".json":
                prompts.append(Prompt(text, label or item, True))
            else:
                parts = [p for p in regex.split(r"\n-{3,}\n", text) if p.strip()]
                prompts += [Prompt(p, label or (item if len(parts) == 1 else f"{item}: {j + 1}"), False)
                            for j, p in enumerate(parts)]
        else:
            prompts.append(Prompt(item, label or item, False))
    return prompts


def _provider(raw: Any, warnings: list[str], fail: Callable[..., InputError]) -> tuple[int | None, bool]:
    """The first provider's max_tokens and whether it is a completion (raw prompt) provider."""
    items = raw if isinstance(raw, list) else [raw] if raw is not None else []
    if len(items) > 1:
        warnings.append("the config has several providers; flakecheck replays every case on the one model it is "
                        "given, with the first provider's max_tokens")
    if not items:
        return None, False
    first = items[0]
    provider_id = first if isinstance(first, str) else first.get("id", "") if isinstance(first, dict) else ""
    config = first.get("config") or {} if isinstance(first, dict) else {}
    max_tokens = config.get("max_tokens") if isinstance(config, dict) else None
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise fail(getattr(first, "line", None), "providers[0].config.max_tokens", "expected a positive integer")
    return max_tokens, ":completion" in str(provider_id)


def _tests(raw: Any, read_file: Callable[..., tuple[Path, str]], fail: Callable[..., InputError]
           ) -> list[tuple[dict[str, Any], int | None, str]]:
    """(test, line, field) for each test, inline or from files, before var expansion."""
    items = raw if isinstance(raw, list) else [raw] if raw is not None else []
    tests: list[tuple[dict[str, Any], int | None, str]] = []
    for i, item in enumerate(items):
        where = f"tests[{i}]" if isinstance(raw, list) else "tests"
        if isinstance(item, str) and item.startswith("file://"):
            tests += _test_file(item, where, read_file, fail)
        elif isinstance(item, dict):
            tests.append((item, getattr(item, "line", None), where))
        else:
            raise fail(None, where, "a test is a mapping (vars, assert, description) or a `file://` path")
    return tests


def _test_file(ref: str, where: str, read_file: Callable[..., tuple[Path, str]], fail: Callable[..., InputError]
               ) -> list[tuple[dict[str, Any], int | None, str]]:
    target, text = read_file(ref, where, None)
    suffix = target.suffix.lower()
    rows: list[tuple[dict[str, Any], int | None, str]] = []
    if suffix == ".csv":
        for n, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
            test: dict[str, Any] = {"vars": {}, "assert": []}
            for key, value in row.items():
                key = (key or "").strip()
                if key.startswith("__expected"):
                    if value:
                        test["assert"].append(assertion_from_string(value))
                elif key == "__description":
                    test["description"] = value
                elif key and not key.startswith("__"):
                    test["vars"][key] = value
            rows.append((test, None, f"{ref} row {n}"))
    elif suffix == ".jsonl":
        for n, text_line in enumerate(text.splitlines(), start=1):
            if text_line.strip():
                try:
                    rows.append((json.loads(text_line), None, f"{ref} line {n}"))
                except ValueError as exc:
                    raise fail(None, f"{where} ({ref} line {n})", f"not valid JSON: {exc}") from None
    elif suffix in CONFIG_SUFFIXES:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise fail(None, f"{where} ({ref})", f"not valid YAML: {exc}") from None
        items = data if isinstance(data, list) else [data]
        rows += [(t, None, f"{ref}[{n}]") for n, t in enumerate(items)]
    else:
        raise fail(None, where, f"{ref}: tests are read from .csv, .yaml, .yml or .jsonl files (a .js or .py "
                   "test generator is code, which flakecheck never runs)")
    for test, _, at in rows:
        if not isinstance(test, dict):
            raise fail(None, at, "a test is a mapping (vars, assert, description)")
    return rows


def assertion_from_string(text: str) -> dict[str, Any]:
    """promptfoo's string form of an assertion (CSV `__expected`): `type: value`, `fn:`/`eval:` JavaScript,
    `grade:` a rubric, a bare type name such as `is-json`; anything else is an `equals`."""
    head, sep, rest = text.partition(":")
    kind = head.strip().lower()
    base = kind.removeprefix("not-")
    aliases = {"fn": "javascript", "eval": "javascript", "grade": "llm-rubric"}
    base = aliases.get(base, base)
    known = set(MAPPED) | CODE_ASSERTIONS | MODEL_ASSERTIONS
    if sep and base in known:
        return {"type": ("not-" if kind.startswith("not-") else "") + base, "value": rest.strip()}
    if not sep and base in known:
        return {"type": kind}
    return {"type": "equals", "value": text}


def _expand(tests: list[tuple[dict[str, Any], int | None, str]], fail: Callable[..., InputError]
            ) -> list[tuple[dict[str, Any], int | None, str]]:
    """A test whose vars hold lists is one test per combination (promptfoo's expansion)."""
    out: list[tuple[dict[str, Any], int | None, str]] = []
    for test, line, where in tests:
        variables = test.get("vars") or {}
        if not isinstance(variables, dict):
            raise fail(line, f"{where}.vars", "expected a mapping of variable names to values")
        lists = {k: v for k, v in variables.items() if isinstance(v, list)}
        if not lists:
            out.append((test, line, where))
            continue
        for combo in itertools.product(*lists.values()):
            out.append(({**test, "vars": {**variables, **dict(zip(lists, combo))}}, line, where))
    return out


def _var_value(value: Any, read_file: Callable[..., tuple[Path, str]], where: str, line: int | None,
               fail: Callable[..., InputError]) -> Any:
    if isinstance(value, str) and value.startswith("file://"):
        if Path(value).suffix.lower() in (".js", ".py", ".ts", ".mjs", ".cjs"):
            raise fail(line, where, "a var from a script is code, which flakecheck never runs")
        return read_file(value, where, line)[1]
    return value


def map_assertions(asserts: list[Any], test: dict[str, Any], env: SandboxedEnvironment, variables: dict[str, Any],
            where: str, line: int | None, fail: Callable[..., InputError]) -> tuple[list[dict[str, Any]], str | None]:
    """The mapped check objects, or none and why the case is ungraded."""
    options = test.get("options") or {}
    if isinstance(options, dict) and (options.get("transform") or options.get("postprocess")):
        return [], "the test transforms the output with JavaScript (options.transform), which flakecheck never runs"
    if test.get("threshold") is not None:
        return [], "the test passes on a weighted score threshold, not on every assertion"
    checks: list[dict[str, Any]] = []
    for i, raw in enumerate(asserts):
        at = f"{where}[{i}]"
        if isinstance(raw, str):
            raw = assertion_from_string(raw)
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise fail(line, at, "an assertion is a mapping with a `type`")
        check, why = _map_assertion(raw, env, variables, fail, line, at)
        if check is None:
            return [], f"{at}: {why}"
        checks.append(check)
    return checks, None


def _map_assertion(raw: dict[str, Any], env: SandboxedEnvironment, variables: dict[str, Any],
                   fail: Callable[..., InputError], line: int | None, at: str) -> tuple[dict[str, Any] | None, str]:
    kind = raw["type"].strip()
    negate = kind.startswith("not-")
    base = kind.removeprefix("not-")
    value = raw.get("value")
    if isinstance(value, str):
        value = _render(env, value, variables, fail, line, f"{at}.value")
    prefix = "not-" if negate else ""
    if raw.get("transform"):
        return None, f"'{kind}' transforms the output with JavaScript, which flakecheck never runs"
    if base in CODE_ASSERTIONS or (isinstance(value, str) and value.startswith("file://")):
        return None, f"'{kind}' runs code, which flakecheck never executes (grade with --grader)"
    if base in MODEL_ASSERTIONS or base.startswith("model-graded"):
        return None, f"'{kind}' needs a model to grade, which flakecheck never runs (grade with --grader)"
    if base in ASSERTIONS:
        check: dict[str, Any] = {"type": prefix + ASSERTIONS[base], "value": value}
        if base == "levenshtein":
            check["threshold"] = raw.get("threshold", 5)
        if base == "regex" and raw.get("flags"):
            return None, "a regex with JavaScript flags"
        return check, ""
    if base == "equals":
        if isinstance(value, (dict, list)):
            return None, "'equals' with an object value (a JSON deep-equality flakecheck does not reproduce)"
        return {"type": prefix + "exact", "value": value, "normalize": "none"}, ""
    if base == "starts-with":
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise fail(line, f"{at}.value", "'starts-with' needs a string value")
        return {"type": prefix + "regex", "value": r"\A" + regex.escape(str(value))}, ""
    if base in ("is-json", "contains-json"):
        if value is not None:
            return None, f"'{kind}' with a JSON schema (not checked by flakecheck)"
        return ({"type": prefix + "json", "whole": True} if base == "is-json" else {"type": prefix + "json"}), ""
    return None, f"'{kind}' has no faithful flakecheck rule (mapped: {', '.join(MAPPED)})"


def _plain(value: Any) -> Any:
    """The YAML values as plain JSON values (for metadata)."""
    return json.loads(json.dumps(value, default=str))
