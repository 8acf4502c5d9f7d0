"""A harness run as a flakecheck suite: one case per sample, carrying exactly the request the model was sent
(chat messages as `messages`, a raw prompt as `prompt`; `max_tokens`; `stop`), the target, the harness's
scorer as checks where it maps (scorers.py), and metadata naming the harness, task, sample id and epoch.

A scorer that does not map leaves the case without checks and its target in `metadata.target`: a `target`
without checks would grade by exact match, which is not the harness's rule. Grade such a replay with
`--grader` (docs/import.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakecheck.data.rundir import atomic_write_text
from flakecheck.harness.model import HarnessLog, SampleRun
from flakecheck.harness.scorers import ScorerMapping


def replayable(log: HarnessLog) -> tuple[dict[str, list[SampleRun]], list[dict[str, str]]]:
    """The log's samples that make cases, by sample id (each with its epochs), and those left out with why: an
    errored sample, one whose request the log lacks, one whose epochs were sent different requests."""
    by_id: dict[str, list[SampleRun]] = {}
    for sample in log.samples:
        by_id.setdefault(sample.sample_id, []).append(sample)
    kept: dict[str, list[SampleRun]] = {}
    skipped: list[dict[str, str]] = []
    for sample_id, runs in by_id.items():
        problem = next((f"epoch {r.epoch}: {r.problem}" for r in runs if r.problem or r.request is None), None)
        if problem is None and len({r.request.key() for r in runs if r.request is not None}) > 1:
            problem = "its epochs were sent different requests (a solver that varies by epoch)"
        if problem is not None:
            skipped.append({"sample_id": sample_id, "log": str(log.path), "reason": problem})
        else:
            kept[sample_id] = runs
    return kept, skipped


def case_line(log: HarnessLog, runs: list[SampleRun], mapping: ScorerMapping) -> dict[str, Any]:
    first = runs[0]
    request = first.request
    assert request is not None
    line: dict[str, Any] = {"id": first.sample_id}
    line["messages" if request.api == "chat" else "prompt"] = request.prompt
    if request.max_tokens is not None:
        line["max_tokens"] = request.max_tokens
    if request.stop:
        line["stop"] = list(request.stop)
    checks = mapping.checks_for(first)
    target: str | list[str] | None = None
    if first.targets:
        target = first.targets[0] if len(first.targets) == 1 else list(first.targets)
    if checks is not None and target is not None:
        line["target"] = target
        line["checks"] = checks
    metadata: dict[str, Any] = {
        "harness": log.harness, "task": log.task, "sample_id": first.sample_id, "epoch": first.epoch,
        "epochs": len(runs), "log": str(log.path), "model": log.model, "scorer": mapping.scorer,
        "scorer_mapped": mapping.mapped,
    }
    if checks is None and target is not None:
        metadata["target"] = target
    if request.temperature not in (None, 0.0):
        metadata["temperature"] = request.temperature  # replays are greedy: not what this request asked for
    if request.max_tokens is None:
        metadata["max_tokens"] = "not sent (the server's default); a replay uses --max-tokens"
    line["metadata"] = metadata
    return line


def suite_lines(log: HarnessLog, mapping: ScorerMapping, ids: list[str] | None = None,
                line_of: Callable[[HarnessLog, list[SampleRun]], dict[str, Any]] | None = None
                ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The suite's lines (in the log's sample order, or only `ids` in that order) and the samples left out;
    `line_of` makes a line (default: case_line with `mapping`'s checks)."""
    kept, skipped = replayable(log)
    wanted = set(ids) if ids is not None else None
    lines = [line_of(log, runs) if line_of is not None else case_line(log, runs, mapping)
             for sample_id, runs in kept.items() if wanted is None or sample_id in wanted]
    return lines, skipped


def write_suite(path: Path, lines: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
