"""Where a probe keeps its work: the run directory `flakecheck run` writes, plus two probe extras.

Each finished level is saved at once under partial/ as `<level>.r<repeat>.parquet` (its traces, as
`run` saves a composition); beside it `probe-answers.<level>.r<repeat>.json` keeps the server's own
text and system_fingerprint per case, and `probe-vocab.json` the token texts (and the run-local ids
of a server that reports only text). The traces file is written last, so a level counts as
finished only when all three are there. The end is the analysis and tables of `run`.

This module is the probe's only glue to the run-directory layer: it is to move onto the shared
run-directory writer and analyse-and-write step once those exist, without touching the rest.
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from flakecheck.analysis import Thresholds, analyse
from flakecheck.checks import check_label
from flakecheck.errors import UserError
from flakecheck.probe.runner import LevelResult
from flakecheck.probe.vocab import Vocab
from flakecheck.replay import Trace
from flakecheck.rundir import (
    CASES_SCHEMA,
    RUNS_SCHEMA,
    TOKENS_SCHEMA,
    RunData,
    load_run,
    read_table,
    to_table,
    write_json,
    write_table,
)
from flakecheck.suite import Suite

PARTIAL, FINGERPRINT, VOCAB = "partial", "fingerprint.json", "probe-vocab.json"


class ProbeStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.partial_dir = self.path / PARTIAL
        self.html_path = self.path / "report.html"

    def begin(self, fingerprint: dict[str, Any], resume: bool) -> None:
        """A new probe: refuse a non-empty directory and record what decides the traces. A resumed one:
        the recorded fingerprint must match, else the saved levels belong to another probe."""
        recorded = self.partial_dir / FINGERPRINT
        if resume:
            if not recorded.is_file():
                raise UserError(f"{self.path}: nothing to resume (no {PARTIAL}/{FINGERPRINT})")
            saved = json.loads(recorded.read_text())
            normal = json.loads(json.dumps(fingerprint, default=str))
            changed = sorted(k for k in set(saved) | set(normal) if saved.get(k) != normal.get(k))
            if changed:
                raise UserError(f"{self.path}: cannot resume, the run's settings differ in: {', '.join(changed)}")
            return
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise UserError(f"{self.path}: already exists and is not empty (choose another --out, or --resume)")
        write_json(recorded, fingerprint)

    def _traces_file(self, level: str, repeat: int) -> Path:
        return self.partial_dir / f"{level}.r{repeat}.parquet"

    def _answers_file(self, level: str, repeat: int) -> Path:
        return self.partial_dir / f"probe-answers.{level}.r{repeat}.json"

    def n_saved(self, work: Sequence[tuple[str, int]]) -> int:
        return sum(self._traces_file(level, repeat).is_file() for level, repeat in work)

    def load_vocab(self) -> Vocab:
        path = self.partial_dir / VOCAB
        return Vocab.from_json(json.loads(path.read_text())) if path.is_file() else Vocab()

    def save_vocab(self, vocab: Vocab) -> None:
        write_json(self.partial_dir / VOCAB, vocab.to_json())

    def saved_level(self, level: str, repeat: int) -> tuple[list[Trace], dict[str, Any]] | None:
        path = self._traces_file(level, repeat)
        if not path.is_file():
            return None
        answers_file = self._answers_file(level, repeat)
        if not answers_file.is_file():
            raise UserError(f"{self.path}: level {level} has saved traces but no {answers_file.name}; "
                            "start a new probe (another --out)")
        rows = read_table(path).to_dict("records")
        traces = [Trace(str(r["case_id"]), str(r["composition"]), int(r["repeat"]), [int(x) for x in r["token_ids"]],
                        [int(x) for x in r["top1_ids"]], [float(x) for x in r["top1_logprobs"]],
                        [int(x) for x in r["top2_ids"]], [float(x) for x in r["top2_logprobs"]],
                        str(r["finish_reason"])) for r in rows]
        return traces, json.loads(answers_file.read_text())

    def save_level(self, level: str, repeat: int, result: LevelResult, vocab: Vocab) -> None:
        write_json(self._answers_file(level, repeat), {
            "answers": result.answers, "seconds": result.seconds, "fillers_sent": result.fillers_sent,
            "fillers_failed": result.fillers_failed, "filler_errors": result.filler_errors,
        })
        self.save_vocab(vocab)
        write_table(self._traces_file(level, repeat), pa.Table.from_pylist([asdict(t) for t in result.traces]))

    def write_run(self, suite: Suite, traces: Sequence[Trace], reference: str, thresholds: Thresholds,
                  decode: Callable[[list[int]], str], token_text: Callable[[int], str], meta: dict[str, Any],
                  timings: dict[str, Any]) -> RunData:
        """The analysis and tables of `run`, meta.json (the probe's `meta` plus what every run records);
        then partial/ goes."""
        import time

        t0 = time.perf_counter()
        tables = analyse(traces, suite.cases, reference, thresholds, decode, token_text)
        timings["analysis_s"] = time.perf_counter() - t0
        write_table(self.path / "runs.parquet", to_table(tables.runs, RUNS_SCHEMA))
        write_table(self.path / "tokens.parquet", to_table(tables.tokens, TOKENS_SCHEMA))
        write_table(self.path / "cases.parquet", to_table(tables.cases, CASES_SCHEMA))
        generated = sum(len(r["token_ids"]) for r in tables.runs)
        timings.update(generated_tokens=generated,
                       tokens_per_s=generated / timings["replay_s"] if timings.get("replay_s") else None)
        write_json(self.path / "meta.json", {
            **meta, "suite": str(suite.path), "suite_name": suite.path.stem, "suite_sha256": suite.sha256,
            "suite_warnings": suite.warnings, "n_cases": len(suite.cases), "reference": reference,
            "thresholds": {"gap_threshold": thresholds.gap_threshold, "gap_window": thresholds.gap_window},
            "versions": _versions(), "timings": timings,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "status": "complete",
            "cases": [{"case_id": c.id, "input": c.input, "targets": list(c.targets),
                       "checks": [check_label(k) for k in c.checks], "metadata": c.metadata, "line": c.line}
                      for c in suite.cases],
        })
        shutil.rmtree(self.partial_dir, ignore_errors=True)
        return load_run(self.path)

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json(self.path / "meta.json", meta)


def _versions() -> dict[str, str | None]:
    """What produced a probe's run directory: this side only (the server's version is under `server`)."""
    import httpx

    import flakecheck

    return {"flakecheck": flakecheck.__version__, "httpx": httpx.__version__, "python": platform.python_version()}
