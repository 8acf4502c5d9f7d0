"""Where a probe keeps its work: the run directory `flakecheck run` writes, plus two probe extras.

Each finished level is saved at once as the run directory's partial traces of that (level,
repeat), as `run` saves a composition; beside them `probe-answers.<level>.r<repeat>.json` keeps the
server's own text and system_fingerprint per case, and `probe-vocab.json` the token texts (and the
run-local ids of a server that reports only text). The traces file is written last, so a level
counts as finished only when all three are there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flakecheck.data.rundir import RunDirectory, write_json
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError
from flakecheck.probe.level_runner import LevelResult
from flakecheck.probe.vocab import Vocab

VOCAB = "probe-vocab.json"


class ProbeStore:
    def __init__(self, path: Path) -> None:
        self.directory = RunDirectory(path)

    @property
    def path(self) -> Path:
        return self.directory.path

    def _answers_file(self, level: str, repeat: int) -> Path:
        return self.directory.partial_dir / f"probe-answers.{level}.r{repeat}.json"

    def load_vocab(self) -> Vocab:
        path = self.directory.partial_dir / VOCAB
        return Vocab.from_json(json.loads(path.read_text())) if path.is_file() else Vocab()

    def save_vocab(self, vocab: Vocab) -> None:
        write_json(self.directory.partial_dir / VOCAB, vocab.to_json())

    def saved_level(self, level: str, repeat: int) -> tuple[list[Trace], dict[str, Any]] | None:
        traces = self.directory.saved_traces(level, repeat)
        if traces is None:
            return None
        answers_file = self._answers_file(level, repeat)
        if not answers_file.is_file():
            raise UserError(f"{self.path}: level {level} has saved traces but no {answers_file.name}; "
                            "start a new probe (another --out)")
        return traces, json.loads(answers_file.read_text())

    def save_level(self, level: str, repeat: int, result: LevelResult, vocab: Vocab) -> None:
        write_json(self._answers_file(level, repeat), {
            "answers": result.answers, "seconds": result.seconds, "fillers_sent": result.fillers_sent,
            "fillers_failed": result.fillers_failed, "filler_errors": result.filler_errors,
        })
        self.save_vocab(vocab)
        self.directory.save_traces(level, repeat, result.traces)
