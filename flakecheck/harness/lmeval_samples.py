"""An lm-evaluation-harness samples file (`--log_samples`: samples_<task>_<timestamp>.jsonl, one JSON object
per document and filter) as a HarnessLog.

Per line: `doc_id`, `target`, `arguments.gen_args_0` = {`arg_0`: the context as sent (the chat messages as
a JSON string when lm-eval applied a chat template for a chat-completions model, else the prompt text),
`arg_1`: the generation settings (`until`, `max_gen_toks`, ...)}, `resps` (the raw answers), `filter` (the
filter pipeline's name), `filtered_resps`, `metrics` and one value per metric. The results_<timestamp>.json
lm-eval writes beside it has the task's config (filters, metric options, the model type and arguments):
read when present, for the scorer mapping and the run's concurrency.

lm-eval's chat-completions model sends `stop` as the first four stop sequences and `max_tokens` as
`max_gen_toks` (default 256); both are kept so a replay sends the same. Its API models return no logprobs
for generation, so lm-eval runs are compared by text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flakecheck.data.jsonl import json_objects
from flakecheck.errors import InputError
from flakecheck.harness.model import HarnessLog, SampleRun, ScorerSpec, SentRequest
from flakecheck.harness.verdicts import verdict

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for API models
CHAT_MODELS = ("local-chat-completions", "openai-chat-completions")
_NAME = re.compile(r"samples_(?P<task>.+)_(?P<stamp>\d{4}-\d\d-\d\dT[\d\-.:]+)\.jsonl$")


def read_lmeval_samples(path: Path, metric: str | None = None, filter_name: str | None = None) -> HarnessLog:
    name = str(path)
    lines = _lines(path)
    results = _results_beside(path)
    task = _task(path, lines, results)
    config = ((results or {}).get("configs") or {}).get(task) or {}
    run = (results or {}).get("config") or {}
    model_args = _model_args(run.get("model_args"))
    chat = _is_chat(run.get("model"), lines)
    filters = [obj.get("filter") for _, obj in lines]
    chosen_filter = filter_name or filters[0]
    if chosen_filter not in filters:
        raise InputError(name, None, "filter", f"--filter {chosen_filter}: the file's filters are "
                         f"{', '.join(sorted({str(f) for f in filters}))}")
    metrics = [m for m in (lines[0][1].get("metrics") or []) if isinstance(m, str)]
    chosen_metric = metric or (metrics[0] if metrics else None)
    if metric is not None and metric not in metrics:
        raise InputError(name, lines[0][0], "metrics", f"--scorer {metric}: the file's metrics are "
                         f"{', '.join(metrics) or 'none'}")
    samples = [_sample(obj, number, name, chat, chosen_metric) for number, obj in lines
               if obj.get("filter") == chosen_filter]
    scorer = None
    if chosen_metric is not None:
        metric_config = next((m for m in config.get("metric_list") or []
                              if isinstance(m, dict) and m.get("metric") == chosen_metric), {})
        filter_config = next((f for f in config.get("filter_list") or []
                              if isinstance(f, dict) and f.get("name") == chosen_filter), None)
        scorer = ScorerSpec(chosen_metric, {
            "filter": chosen_filter,
            "filter_steps": None if filter_config is None else filter_config.get("filter"),
            "metric_options": {k: v for k, v in metric_config.items()
                               if k not in ("metric", "aggregation", "higher_is_better")},
            "config_found": bool(config),
        })
    log = HarnessLog(
        path=path, harness="lm-eval", task=task, model=str(model_args.get("model") or run.get("model") or "?"),
        samples=samples, scorer=scorer, other_scorers=[m for m in metrics if m != chosen_metric],
        concurrency=_positive_int(model_args.get("num_concurrent")), created=(results or {}).get("date"),
        versions={"lm_eval": str((results or {}).get("lm_eval_version"))} if results else {},
    )
    if results is None:
        log.warnings.append(f"{name}: no results_*.json beside it: the task's filters and metric options are "
                            "unknown, so its scorer is not mapped, and the run's concurrency is unknown")
    other_filters = sorted({str(f) for f in filters} - {str(chosen_filter)})
    if other_filters:
        log.warnings.append(f"{name}: verdicts of filter '{chosen_filter}' (also in the file: "
                            f"{', '.join(other_filters)}; choose with --filter)")
    return log


def _lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    name = str(path)
    if not path.is_file():
        raise InputError(name, None, None, "samples file not found" if not path.exists() else "not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(name, None, None, f"not an lm-eval samples file (not UTF-8: {exc.reason})") from None
    lines = []
    for number, obj in json_objects(name, text, what="an lm-eval samples file"):
        for key in ("doc_id", "arguments", "resps"):
            if key not in obj:
                raise InputError(name, number, key, "missing: not an lm-eval --log_samples line")
        lines.append((number, obj))
    if not lines:
        raise InputError(name, None, None, "the samples file is empty")
    return lines


def _results_beside(path: Path) -> dict[str, Any] | None:
    match = _NAME.search(path.name)
    if match is None:
        return None
    candidate = path.with_name(f"results_{match.group('stamp')}.json")
    try:
        data = json.loads(candidate.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _task(path: Path, lines: list[tuple[int, dict[str, Any]]], results: dict[str, Any] | None) -> str:
    match = _NAME.search(path.name)
    if match is not None:
        return match.group("task")
    configs = list((results or {}).get("configs") or {})
    return configs[0] if len(configs) == 1 else path.stem


def _model_args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        return dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
    return {}


def _positive_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _is_chat(model_type: Any, lines: list[tuple[int, dict[str, Any]]]) -> bool:
    if isinstance(model_type, str):
        return model_type in CHAT_MODELS
    context = _context((lines[0][1].get("arguments") or {}).get("gen_args_0", {}).get("arg_0"))
    return _messages(context) is not None  # no results file: a context that parses as messages was chat


def _context(raw: Any) -> Any:
    """lm-eval logs a chat context as a one-element list holding the messages' JSON."""
    return raw[0] if isinstance(raw, list) and len(raw) == 1 else raw


def _messages(context: Any) -> list[dict[str, str]] | None:
    if not isinstance(context, str) or not context.startswith("["):
        return None
    try:
        data = json.loads(context)
    except json.JSONDecodeError:
        return None
    if isinstance(data, list) and data and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in data):
        return [{"role": m["role"], "content": m["content"]} for m in data]
    return None


def _sample(obj: dict[str, Any], line: int, path: str, chat: bool, metric: str | None) -> SampleRun:
    args = obj["arguments"].get("gen_args_0") if isinstance(obj["arguments"], dict) else None
    if not isinstance(args, dict) or "arg_0" not in args:
        raise InputError(path, line, "arguments.gen_args_0", "missing the request's arguments")
    settings = args.get("arg_1") if isinstance(args.get("arg_1"), dict) else {}
    score = obj.get(metric) if metric else None
    resps = obj["resps"]
    first = resps[0] if isinstance(resps, list) and resps else None
    text = first[0] if isinstance(first, list) and first else first
    base = {"sample_id": str(obj["doc_id"]), "epoch": 1, "steps": None, "passed": verdict(score), "score": score,
            "targets": _targets(obj.get("target")),
            "metadata": {"doc_hash": obj.get("doc_hash"), "prompt_hash": obj.get("prompt_hash")}}
    if not isinstance(args.get("arg_1"), dict) or not isinstance(text, str):
        return SampleRun(**base, request=None, output="", finish_reason="unknown",
                         problem="not a generation request (loglikelihood or multiple choice): nothing to replay")
    context = _context(args["arg_0"])
    messages = _messages(context) if chat else None
    if chat and messages is None:
        raise InputError(path, line, "arguments.gen_args_0.arg_0", "expected the chat messages as a JSON string")
    if not isinstance(context, str):
        raise InputError(path, line, "arguments.gen_args_0.arg_0", "expected the context as a string")
    until = settings.get("until")
    stops = [until] if isinstance(until, str) else [s for s in until or [] if isinstance(s, str) and s]
    if chat:
        stops = stops[:4]  # lm-eval's chat-completions model sends at most four
    max_tokens = settings.get("max_tokens", settings.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    temperature = settings.get("temperature", 0)
    request = SentRequest(messages if messages is not None else context,
                          max_tokens if isinstance(max_tokens, int) else DEFAULT_MAX_GEN_TOKS, tuple(stops),
                          float(temperature) if isinstance(temperature, (int, float)) else None)
    # with repeats lm-eval generated several answers; a take_first filter scored the first, which is compared
    return SampleRun(**base, request=request, output=text, finish_reason="unknown")


def _targets(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    return tuple(str(t) for t in (raw if isinstance(raw, list) else [raw]))
