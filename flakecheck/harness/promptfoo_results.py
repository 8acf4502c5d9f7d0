"""promptfoo's `eval -o results.json` as a HarnessLog: one sample per result, its case id promptfoo's test ×
prompt (flakecheck.data.promptfoo_config.case_id), its epoch the repeat, its verdict promptfoo's own
(`success`, i.e. gradingResult.pass), and the request rebuilt as promptfoo's OpenAI chat provider sent it
(the rendered prompt as chat messages, or as one user message).

Read: results format version 3 (promptfoo 0.x; `results.version`). With `--repeat R`, promptfoo numbers a
test's repeats consecutively: testIdx = test × R + repeat (R from `runtimeOptions.repeat` or
`config.evaluateOptions.repeat`).

The file keeps no logprobs. `flakecheck serve --record-responses FILE` writes every answer's tokens and top-2
logprobs keyed by a hash of the prompt (flakecheck.serve.response_record); given that record, each result takes
the first unused line with the same prompt and the same answer text sent while that eval ran (between the file's
`metadata.evaluationCreatedAt` and `exportedAt`, so evals run one after another against one server each get
their own lines), and its case is compared by token (near-ties and flip kinds known). Within one eval, answers
of one prompt with the same text have the same tokens; their logprobs, which may differ in the last digits
between batches, are assigned in record order. Without a record, or where a result
has no line, only text divergences are known (flakecheck.harness.traces)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from flakecheck.data.jsonl import json_objects
from flakecheck.data.promptfoo_config import case_id, chat_messages, environment, map_assertions
from flakecheck.errors import InputError
from flakecheck.harness.model import HarnessLog, SampleRun, ScorerSpec, SentRequest
from flakecheck.harness.scorers import ScorerMapping
from flakecheck.probe.parse import Step, TokenRef
from flakecheck.serve.response_record import prompt_sha256

RESULTS_VERSIONS = (3,)
MAPPING = ScorerMapping("promptfoo", True, "promptfoo's own pass/fail (gradingResult.pass); its assertions become "
                        "checks where flakecheck has the same rule, else the case is ungraded on a replay")
ERROR_REASON = 2  # promptfoo's ResultFailureReason.ERROR (1 is ASSERT: graded and failed)


class RecordedAnswers:
    """A `--record-responses` file as a pool of answers by (prompt hash, text), taken in file order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pool: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(str(path), None, None, f"cannot read the record: {exc.strerror or exc}") from None
        self.n_lines = 0
        for number, obj in json_objects(str(path), text):
            if not isinstance(obj.get("tokens"), list) or not isinstance(obj.get("text"), str):
                raise InputError(str(path), number, "tokens", "not a `flakecheck serve --record-responses` line")
            if obj.get("prompt_sha256"):
                self.pool[(obj["prompt_sha256"], obj["text"])].append(obj)
            self.n_lines += 1

    def take(self, prompt: str | list[dict[str, str]], output: str, window: tuple[str, str] | None = None
             ) -> list[Step] | None:
        """The steps of the first unused answer to `prompt` with text `output` (sent within `window`, ISO UTC
        times, when given), or None."""
        queue = self.pool.get((prompt_sha256(prompt), output)) or []
        for i, line in enumerate(queue):
            if window is None or not isinstance(line.get("time"), str) or window[0] <= line["time"] <= window[1]:
                del queue[i]
                return [_step(token) for token in line["tokens"]]
        return None


def _step(token: dict[str, Any]) -> Step:
    def ref(t: dict[str, Any]) -> TokenRef:
        raw = bytes(t["bytes"]) if isinstance(t.get("bytes"), list) else None
        return TokenRef(None, str(t["token"]), raw)  # by bytes: text-unit traces share the vocabulary

    top2 = token["top2"]
    return Step(ref(token), float(token["logprob"]), ((ref(top2), float(top2["logprob"])),))


def read_promptfoo_results(path: Path, record: RecordedAnswers | None = None) -> HarnessLog:
    name = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(name, None, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(name, None, None, "not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InputError(name, exc.lineno, None, f"not valid JSON (truncated?): {exc.msg}") from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, dict):
        raise InputError(name, None, "results", "not a promptfoo `eval -o FILE.json` output (no `results` object)")
    version = results.get("version")
    if version not in RESULTS_VERSIONS:
        raise InputError(name, None, "results.version", f"results format {version!r}: flakecheck reads version "
                         f"{', '.join(map(str, RESULTS_VERSIONS))} (promptfoo 0.x); export with a promptfoo 0.x")
    rows = results.get("results")
    prompts = results.get("prompts")
    if not isinstance(rows, list) or not isinstance(prompts, list) or not prompts:
        raise InputError(name, None, "results.results", "expected the list of results and of prompts")
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    options = {**(config.get("evaluateOptions") or {}), **(data.get("runtimeOptions") or {})}
    repeat = options.get("repeat") or 1
    if not isinstance(repeat, int) or repeat < 1:
        raise InputError(name, None, "runtimeOptions.repeat", f"expected a positive integer, got {repeat!r}")
    provider = _first_provider(config)
    max_tokens = provider.get("max_tokens") if isinstance(provider.get("max_tokens"), int) else None
    tests = _tests(rows, repeat, name)
    descriptions = [t.get("description") for t in tests.values()]
    env = environment()
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    window = _window(meta)
    samples = []
    matched = 0
    for i, row in enumerate(rows):
        where = f"results.results[{i}]"
        if not isinstance(row, dict):
            raise InputError(name, None, where, "expected an object")
        test_idx, prompt_idx = row.get("testIdx"), row.get("promptIdx")
        if not isinstance(test_idx, int) or not isinstance(prompt_idx, int) or not 0 <= prompt_idx < len(prompts):
            raise InputError(name, None, f"{where}.testIdx", "expected integer testIdx and promptIdx")
        test_case = row.get("testCase") if isinstance(row.get("testCase"), dict) else {}
        description = test_case.get("description")
        test = test_idx // repeat
        label = (prompts[prompt_idx] or {}).get("label") if isinstance(prompts[prompt_idx], dict) else None
        sample_id = case_id(description, test, label, prompt_idx, len(prompts),
                            description is not None and descriptions.count(description) > 1)
        raw = (row.get("prompt") or {}).get("raw") if isinstance(row.get("prompt"), dict) else None
        if not isinstance(raw, str):
            raise InputError(name, None, f"{where}.prompt.raw", "expected the rendered prompt string")
        response = row.get("response") if isinstance(row.get("response"), dict) else {}
        output = response.get("output")
        messages = chat_messages(raw) or [{"role": "user", "content": raw}]
        request = SentRequest(messages, max_tokens, (), provider.get("temperature"))
        grading = row.get("gradingResult") if isinstance(row.get("gradingResult"), dict) else {}
        problem = None
        if row.get("failureReason") == ERROR_REASON or not isinstance(output, str):
            problem = f"promptfoo reports an error: {str(row.get('error') or 'no output')[:200]}"
        text = output if isinstance(output, str) else ""
        steps = record.take(messages, text, window) if record is not None and problem is None else None
        matched += steps is not None
        checks, ungraded = map_assertions(test_case.get("assert") or [], test_case, env, test_case.get("vars") or {},
                                          f"{where}.testCase.assert", None,
                                          lambda _line, at, message: InputError(name, None, at, message))
        samples.append(SampleRun(
            sample_id=sample_id, epoch=test_idx % repeat + 1, request=request, output=text, steps=steps,
            finish_reason=str(response.get("finishReason") or "unknown"), passed=_passed(row, grading),
            score=grading.get("score", row.get("score")), targets=(), problem=problem,
            metadata={"checks": checks, "ungraded": ungraded, "test_index": test, "prompt_index": prompt_idx,
                      "prompt_label": label, "description": description, "vars": test_case.get("vars") or {}}))
    samples.sort(key=lambda s: (s.metadata["test_index"], s.metadata["prompt_index"], s.epoch))
    log = HarnessLog(
        path=path, harness="promptfoo", task=str(config.get("description") or path.stem),
        model=str(provider.get("id") or "?"), samples=samples, scorer=ScorerSpec("promptfoo", {}),
        concurrency=options.get("maxConcurrency") if isinstance(options.get("maxConcurrency"), int) else None,
        created=meta.get("evaluationCreatedAt"), versions={"promptfoo": str(meta.get("promptfooVersion", "?"))},
    )
    if record is None:
        log.warnings.append(f"{name}: promptfoo's results keep no logprobs and no --record was given: only text "
                            "divergences are known (no near-ties, no flip kinds); run `flakecheck serve "
                            "--record-responses FILE` and pass --record FILE")
    elif matched < len(samples):
        log.warnings.append(f"{name}: {len(samples) - matched} of {len(samples)} results have no line in "
                            f"{record.path}; their cases are compared by text")
    return log


def _window(meta: dict[str, Any]) -> tuple[str, str] | None:
    """When the eval ran (its start and its export, ISO UTC), to take only the record lines it caused."""
    start, end = meta.get("evaluationCreatedAt"), meta.get("exportedAt")
    if isinstance(start, str) and isinstance(end, str) and start.endswith("Z") and end.endswith("Z"):
        return start, end
    return None


def _passed(row: dict[str, Any], grading: dict[str, Any]) -> bool | None:
    if row.get("failureReason") == ERROR_REASON:
        return None
    value = grading.get("pass", row.get("success"))
    return value if isinstance(value, bool) else None


def _first_provider(config: dict[str, Any]) -> dict[str, Any]:
    providers = config.get("providers")
    first = providers[0] if isinstance(providers, list) and providers else providers
    if isinstance(first, str):
        return {"id": first}
    if not isinstance(first, dict):
        return {}
    settings = first.get("config") if isinstance(first.get("config"), dict) else {}
    return {"id": first.get("id"), **settings}


def _tests(rows: list[Any], repeat: int, name: str) -> dict[int, dict[str, Any]]:
    """Each test (after promptfoo's expansion) by index, from its first result; a repeat sent other vars is an
    error (the file is not what --repeat writes)."""
    tests: dict[int, dict[str, Any]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("testIdx"), int):
            continue
        test = row["testIdx"] // repeat
        case = row.get("testCase") if isinstance(row.get("testCase"), dict) else {}
        seen = tests.setdefault(test, case)
        if seen.get("vars") != case.get("vars"):
            raise InputError(name, None, f"results.results[{i}].testCase.vars", f"test {test + 1}'s repeats have "
                             f"different vars: not the layout of `--repeat {repeat}`")
    return tests


def check_same_config(logs: list[HarnessLog]) -> None:
    """InputError unless every file holds the same cases sent the same requests (one config, several runs)."""
    first = {s.sample_id: s.request.key() for s in logs[0].samples if s.request is not None}
    for log in logs[1:]:
        other = {s.sample_id: s.request.key() for s in log.samples if s.request is not None}
        missing, extra = sorted(set(first) - set(other)), sorted(set(other) - set(first))
        if missing or extra:
            what = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which {logs[0].path} lacks"
            raise InputError(str(log.path), None, "results.results", f"not a run of the config of {logs[0].path}: "
                             f"it {what} ({len(missing) + len(extra)} case(s) differ)")
        changed = sorted(i for i in first if first[i] != other[i])
        if changed:
            raise InputError(str(log.path), None, "results.results", f"case {changed[0]!r} was sent another prompt "
                             f"or max_tokens than in {logs[0].path}: the configs differ")


def case_line(log: HarnessLog, runs: list[SampleRun]) -> dict[str, Any]:
    """A case's suite line: the request promptfoo sent, the assertions as checks where they map."""
    first = runs[0]
    request = first.request
    assert request is not None
    info = first.metadata
    line: dict[str, Any] = {"id": first.sample_id, "messages": request.prompt}
    if request.max_tokens is not None:
        line["max_tokens"] = request.max_tokens
    if info["checks"]:
        line["assert"] = info["checks"]
    line["metadata"] = {"harness": "promptfoo", "log": str(log.path), "epochs": len(runs), "model": log.model,
                        "promptfoo": {k: info[k] for k in ("test_index", "prompt_index", "prompt_label",
                                                           "description", "vars")},
                        **({"ungraded": info["ungraded"]} if info["ungraded"] else {})}
    return line
