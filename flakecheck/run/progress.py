"""The progress bar of a run: compositions x cases, with tokens/s and ETA (rich, on stderr)."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from flakecheck.data.traces import Trace


class ReplayProgress:
    def __init__(self, total_cases: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self.tokens = 0
        self.started = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>8} tok/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self.task = self.progress.add_task("replay", total=total_cases, rate="-")

    def __enter__(self) -> ReplayProgress:
        self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()

    def start(self, composition: str) -> None:
        self.progress.update(self.task, description=composition)

    def skip(self, composition: str, cases: int) -> None:
        """A composition finished by an earlier, interrupted run (--resume)."""
        self.progress.update(self.task, description=f"{composition} (saved)", advance=cases)

    def case_done(self, trace: Trace) -> None:
        self.tokens_done(len(trace.token_ids))

    def tokens_done(self, tokens: int) -> None:
        """One case finished with `tokens` generated tokens (here, or on a cluster's actor)."""
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(self.task, advance=1, rate=f"{rate:.0f}")
