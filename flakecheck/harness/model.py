"""What flakecheck keeps of a harness run: per sample, the request the model was sent, what came back
(with the logprobs where the log has them) and the harness's own verdict; per log, the task, the model and
the scorers. Both readers (inspect_samples.py, lmeval_samples.py) produce these; nothing downstream knows
which harness wrote the log."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakecheck.probe.parse import Step

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class SentRequest:
    """Exactly what the model was sent: chat messages or a raw prompt, and the generation settings."""

    prompt: str | Messages  # a list: chat messages (through the chat template); a string: raw completion text
    max_tokens: int | None
    stop: tuple[str, ...] = ()
    temperature: float | None = None  # None: not sent (the server's default, greedy on flakecheck serve)

    @property
    def api(self) -> str:
        return "chat" if isinstance(self.prompt, list) else "completions"

    def key(self) -> tuple[Any, ...]:
        """What must be equal for two samples to be one case sent twice."""
        prompt = tuple(tuple(sorted(m.items())) for m in self.prompt) if isinstance(self.prompt, list) else self.prompt
        return (prompt, self.max_tokens, self.stop)


@dataclass(frozen=True)
class SampleRun:
    """One sample (one epoch) of one harness run."""

    sample_id: str
    epoch: int  # 1-based, as inspect counts; lm-eval runs are epoch 1
    request: SentRequest | None  # None: the log does not say what was sent (see `problem`)
    output: str  # the answer text the harness graded
    steps: list[Step] | None  # the generated tokens with their top logprobs; None: the log has none
    finish_reason: str
    passed: bool | None  # the harness scorer's verdict; None: not scored, or not a pass/fail value
    score: Any  # the scorer's value as logged (for meta.json)
    targets: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why this sample cannot be compared (errored, no model call, tool use, ...)
    n_model_calls: int = 1


@dataclass(frozen=True)
class ScorerSpec:
    """A scorer (inspect) or a metric with its filter (lm-eval) as the log names it."""

    name: str
    params: dict[str, Any]


@dataclass
class HarnessLog:
    path: Path
    harness: str  # "inspect_ai" | "lm-eval"
    task: str
    model: str
    samples: list[SampleRun]
    scorer: ScorerSpec | None  # the one whose verdicts are recorded
    other_scorers: list[str] = field(default_factory=list)
    concurrency: int | None = None  # inspect's max_connections, lm-eval's num_concurrent
    created: str | None = None
    status: str = "success"
    versions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return max((s.epoch for s in self.samples), default=1)
