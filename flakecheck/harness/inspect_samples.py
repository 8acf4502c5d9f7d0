"""An inspect_ai log (as inspect_log.py reads it) as a HarnessLog: per sample, the request of the model call
whose output was scored, that output with its logprobs, and the chosen scorer's value.

The true input of the model call is the request as it went over the wire (the model event's `call.request`:
messages, max_tokens, stop, temperature) where it has the OpenAI chat shape; where a provider logs no call or
another shape, the event's own `input` messages and `config` stand in. A sample's answer call is the last
model event before scoring starts: a scorer that calls a model (model-graded) adds model events after it,
which are the scorer's, not the sample's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flakecheck.errors import InputError
from flakecheck.harness.model import HarnessLog, SampleRun, ScorerSpec, SentRequest
from flakecheck.harness.verdicts import verdict
from flakecheck.probe.parse import AnswerError, parse_answer

FINISH = {"max_tokens": "length", "stop": "stop", "model_length": "length"}


def parse_inspect_log(log: dict[str, Any], path: Path, scorer: str | None = None) -> HarnessLog:
    name = str(path)
    spec = log["eval"]
    task = str(spec.get("task") or spec.get("task_registry_name") or "task")
    model = str(spec.get("model") or "?")
    scorers = [s for s in spec.get("scorers") or [] if isinstance(s, dict) and s.get("name")]
    names = [str(s["name"]) for s in scorers]
    chosen = _chosen_scorer(scorers, names, scorer, name)
    if chosen is not None and chosen.name.removeprefix("inspect_ai/") == "choice":
        chosen.params["_multiple_choice"] = _multiple_choice(log.get("plan") or {})
    samples = log.get("samples")
    if not samples:
        raise InputError(name, None, "samples", "the log has no samples (was it written with log_samples off, or "
                         "did the eval stop before any sample finished?)")
    config = {**((log.get("plan") or {}).get("config") or {}), **(spec.get("model_generate_config") or {})}
    runs = [_sample(s, i, config, chosen.name if chosen else None, name) for i, s in enumerate(samples)]
    runs.sort(key=lambda r: (_order(spec, r.sample_id), r.epoch))
    result = HarnessLog(
        path=path, harness="inspect_ai", task=task, model=model, samples=runs, scorer=chosen,
        other_scorers=[n for n in names if chosen is None or n != chosen.name],
        concurrency=_int(config.get("max_connections")), created=spec.get("created"),
        status=str(log.get("status") or "?"), versions={k: str(v) for k, v in (spec.get("packages") or {}).items()},
    )
    if result.status != "success":
        error = (log.get("error") or {}).get("message") if isinstance(log.get("error"), dict) else None
        result.warnings.append(f"{name}: the eval's status is '{result.status}'" + (f" ({error})" if error else "")
                               + "; only its finished samples are read")
    return result


def _chosen_scorer(scorers: list[dict[str, Any]], names: list[str], wanted: str | None, path: str
                   ) -> ScorerSpec | None:
    if wanted is not None:
        if wanted not in names:
            raise InputError(path, None, "eval.scorers", f"--scorer {wanted}: the log's scorers are "
                             f"{', '.join(names) or 'none'}")
        found = scorers[names.index(wanted)]
    elif scorers:
        found = scorers[0]  # the task's first scorer: inspect's headline score
    else:
        return None
    return ScorerSpec(str(found["name"]), dict(found.get("options") or {}))


def _multiple_choice(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The multiple_choice solver's settings that decide how choice() reads an answer (None: not in the plan)."""
    for step in plan.get("steps") or []:
        if isinstance(step, dict) and str(step.get("solver", "")).removeprefix("inspect_ai/") == "multiple_choice":
            params = step.get("params") or {}
            return {"shuffle": bool(params.get("shuffle")), "multiple_correct": bool(params.get("multiple_correct"))}
    return None


def _order(spec: dict[str, Any], sample_id: str) -> tuple[int, str]:
    ids = [str(i) for i in ((spec.get("dataset") or {}).get("sample_ids") or [])]
    return (ids.index(sample_id), sample_id) if sample_id in ids else (len(ids), sample_id)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sample(sample: Any, index: int, config: dict[str, Any], scorer: str | None, path: str) -> SampleRun:
    where = f"samples[{index}]"
    if not isinstance(sample, dict) or sample.get("id") is None:
        raise InputError(path, None, where, "a sample needs an 'id'")
    sample_id, epoch = str(sample["id"]), sample.get("epoch", 1)
    if not isinstance(epoch, int):
        raise InputError(path, None, f"{where}.epoch", "expected an integer")
    targets = _targets(sample.get("target"))
    score = ((sample.get("scores") or {}).get(scorer) or {}).get("value") if scorer else None
    base = {"sample_id": sample_id, "epoch": epoch, "targets": targets, "score": score, "passed": verdict(score),
            "metadata": {"sample_metadata": sample.get("metadata") or {},
                         **({"n_choices": len(sample["choices"])} if isinstance(sample.get("choices"), list) else {})}}
    error = sample.get("error")
    calls = _answer_calls(sample.get("events") or [])
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return SampleRun(**base, request=None, output="", steps=None, finish_reason="error",
                         problem=f"the sample errored: {message}", n_model_calls=len(calls))
    if not calls:
        return SampleRun(**base, request=None, output=_completion(sample.get("output")), steps=None,
                         finish_reason="unknown", problem="no model call in the sample's events", n_model_calls=0)
    event = calls[-1]
    request, problem = _request(event, config)
    output, steps, finish, output_problem = _output(event.get("output"), f"{where}.events[model].output", path)
    return SampleRun(**base, request=request, output=output, steps=steps, finish_reason=finish,
                     problem=problem or output_problem, n_model_calls=len(calls))


def _answer_calls(events: list[Any]) -> list[dict[str, Any]]:
    """The model events before the first score event (those after it belong to a model-graded scorer)."""
    calls = []
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("event") == "score":
            break
        if event.get("event") == "model":
            calls.append(event)
    return calls


def _targets(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    return tuple(str(t) for t in items)


def _request(event: dict[str, Any], config: dict[str, Any]) -> tuple[SentRequest | None, str | None]:
    call = event.get("call") if isinstance(event.get("call"), dict) else {}
    wire = call.get("request") if isinstance(call.get("request"), dict) else None
    settings = {**config, **(event.get("config") or {})}
    # The wire request is exactly what was sent where it is in the OpenAI chat shape (the openai-api, vllm,
    # together... providers: what flakecheck replays). Other providers serialise differently (Anthropic puts the
    # system prompt beside the messages, Google uses `contents`): there inspect's own message list stands in.
    if wire is not None and isinstance(wire.get("messages"), list) and "system" not in wire:
        raw_messages, max_tokens = wire["messages"], wire.get("max_tokens", wire.get("max_completion_tokens"))
        stop, temperature = wire.get("stop"), wire.get("temperature")
    elif isinstance(event.get("input"), list):
        raw_messages, max_tokens = event["input"], settings.get("max_tokens")
        stop, temperature = settings.get("stop_seqs"), settings.get("temperature")
    else:
        return None, "the model call's request is not in the log"
    if (wire or {}).get("tools") or event.get("tools"):
        return None, "the model call offered tools: flakecheck replays plain text generation only"
    messages = []
    for message in raw_messages:
        text = _text(message.get("content")) if isinstance(message, dict) else None
        if text is None or message.get("tool_calls") or message.get("role") == "tool":
            return None, "a message has non-text content (image, audio, tool call): not replayable as text"
        messages.append({"role": str(message.get("role")), "content": text})
    stops = tuple(s for s in ([stop] if isinstance(stop, str) else stop or []) if isinstance(s, str) and s)
    return SentRequest(messages, _int(max_tokens), stops,
                       float(temperature) if isinstance(temperature, (int, float)) else None), None


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None


def _completion(output: Any) -> str:
    return str(output.get("completion") or "") if isinstance(output, dict) else ""


def _output(output: Any, where: str, path: str) -> tuple[str, list | None, str, str | None]:
    """The answer text, its steps where the log has logprobs, the finish reason, and any problem."""
    if not isinstance(output, dict):
        raise InputError(path, None, where, "expected the model output object")
    choices = output.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return _completion(output), None, "unknown", "the model call returned no choice"
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    text = _text(message.get("content"))
    if text is None:
        return _completion(output), None, "unknown", "the answer has non-text content"
    finish = FINISH.get(str(choice.get("stop_reason")), str(choice.get("stop_reason") or "unknown"))
    logprobs = choice.get("logprobs")
    if not logprobs:
        return text, None, finish, None
    body = {"choices": [{"message": {"content": text}, "logprobs": logprobs, "finish_reason": finish}]}
    try:
        return text, parse_answer(body, "chat").steps, finish, None
    except AnswerError as exc:
        raise InputError(path, None, f"{where}.choices[0].logprobs", str(exc)) from None
