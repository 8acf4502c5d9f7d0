"""The diff on the terminal (rich): both sides, the score change with its interval, the one-run diff, the
classes, the cases that are not the same, notes and the gate's verdict."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flakecheck.diff.classify import CLASSES
from flakecheck.diff.facts import listed, mixed_line, rate, reference_change, side_line
from flakecheck.diff.result import DiffResult
from flakecheck.diff.score import change_sentence

KIND_STYLE = {"regression": "bold red", "improvement": "green", "noise": "magenta", "changed-text": "yellow",
              "same": "dim"}


def render_diff(result: DiffResult, console: Console, top: int = 30) -> None:
    console.print(f"[bold]A[/] {escape(side_line(result.a))}")
    console.print(f"[bold]B[/] {escape(side_line(result.b))}")
    console.print(escape(change_sentence(result.score)))
    mixed = mixed_line(result.score)
    if mixed:
        console.print(f"  {escape(mixed)}")
    console.print(escape(result.raw_sentence()))
    counts = result.counts
    console.print(f"{len(result.cases)} cases: " + " · ".join(f"[{KIND_STYLE[k]}]{counts[k]} {k}[/]" for k in CLASSES))
    if result.noise_line():
        console.print(f"  {escape(result.noise_line() or '')}")
    cases = listed(result)
    if cases and top:
        table = Table(title=f"cases that differ ({len(cases)}; the same ones are not listed)", title_justify="left")
        for column in ("case", "class", "A pass", "B pass", "reference", "why"):
            table.add_column(column, overflow="fold")
        for case in cases[:top]:
            table.add_row(escape(case.label), f"[{KIND_STYLE[case.kind]}]{case.kind}[/]",
                          rate(case.passed_a, case.graded_a), rate(case.passed_b, case.graded_b),
                          reference_change(case), escape(case.why))
        console.print(table)
        if len(cases) > top:
            console.print(f"  … and {len(cases) - top} more (--top N, or --json for all)")
    for note in result.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    verdict = "[bold green]PASSED[/]" if result.passed else "[bold red]FAILED[/]"
    console.print(f"diff gate {verdict}")
    for failure in result.failures:
        console.print(f"  [red]✗[/] {escape(failure)}")

