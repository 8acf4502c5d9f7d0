"""Read an inspect_ai log (.eval or .json) into one plain dict in the .json log's shape, every sample's
condensed references resolved: a model event's `input_refs` and its call's `call_refs` point into the
sample's `events_data`, and long strings are `attachment://<id>` references into its `attachments`.

Through inspect_ai's own reader (`inspect_ai.log.read_eval_log`) where it is installed (the optional extra
`flakecheck[inspect]`), otherwise through the documented format (inspect_zip.py for .eval). Both give the
same dict (a property the harness tests check on real logs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flakecheck.errors import InputError
from flakecheck.harness.inspect_zip import read_eval_zip

ATTACHMENT = "attachment://"


def read_inspect_log(path: Path, use_inspect_ai: bool = True) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(str(path), None, None, "log file not found" if not path.exists() else "not a file")
    if path.suffix not in (".eval", ".json"):
        raise InputError(str(path), None, None, "an inspect_ai log is a .eval or .json file")
    log = _with_inspect_ai(path) if use_inspect_ai else None
    if log is None:
        log = read_eval_zip(path) if path.suffix == ".eval" else _read_json(path)
    if not isinstance(log, dict) or not isinstance(log.get("eval"), dict):
        raise InputError(str(path), None, "eval", "not an inspect_ai log (no 'eval' object)")
    samples = log.get("samples")
    if samples is not None and not isinstance(samples, list):
        raise InputError(str(path), None, "samples", "expected a list")
    for sample in samples or []:
        if isinstance(sample, dict):
            resolve_sample(sample)
    return log


def inspect_ai_version() -> str | None:
    try:
        import inspect_ai
    except ImportError:
        return None
    return str(getattr(inspect_ai, "__version__", "unknown"))


def _with_inspect_ai(path: Path) -> dict[str, Any] | None:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        return None
    try:
        log = read_eval_log(str(path), resolve_attachments=True)
    except Exception as exc:  # inspect_ai's reader raises many kinds for a file that is not a log
        raise InputError(str(path), None, None,
                         f"not an inspect_ai log (inspect_ai could not read it: {exc})") from None
    return json.loads(log.model_dump_json())


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(str(path), getattr(exc, "lineno", None), None, f"not an inspect_ai log (malformed JSON: "
                         f"{exc})") from None


def resolve_sample(sample: dict[str, Any]) -> None:
    """Expand a sample's references in place (a no-op on a sample inspect_ai's reader already resolved)."""
    data = sample.get("events_data") or {}
    messages, calls = data.get("messages") or [], data.get("calls") or []
    for event in sample.get("events") or []:
        if not isinstance(event, dict) or event.get("event") != "model":
            continue
        if not event.get("input") and event.get("input_refs"):
            event["input"] = _ranges(messages, event["input_refs"])
        call = event.get("call")
        if isinstance(call, dict) and call.get("call_refs") and isinstance(call.get("request"), dict):
            key = call.get("call_key") or "messages"
            if not call["request"].get(key):
                call["request"][key] = _ranges(calls, call["call_refs"])
    attachments = sample.get("attachments") or {}
    if attachments:
        for key in ("input", "messages", "output", "events", "target"):
            if key in sample:
                sample[key] = _attach(sample[key], attachments)


def _ranges(items: list[Any], refs: Any) -> list[Any]:
    out: list[Any] = []
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, list) and len(ref) == 2 and all(isinstance(i, int) for i in ref):
            out.extend(items[ref[0]:ref[1]])
    return out


def _attach(value: Any, attachments: dict[str, str]) -> Any:
    if isinstance(value, str) and value.startswith(ATTACHMENT):
        return attachments.get(value[len(ATTACHMENT):], value)
    if isinstance(value, list):
        return [_attach(v, attachments) for v in value]
    if isinstance(value, dict):
        return {k: _attach(v, attachments) for k, v in value.items()}
    return value
