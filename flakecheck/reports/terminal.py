"""The terminal summary (rich): printed at the end of `flakecheck run` and by `flakecheck report`."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flakecheck.analysis.score_swing import swing_sentence
from flakecheck.data.record import RunRecord
from flakecheck.data.rundir import STATUSES, RunData
from flakecheck.reports.explanation import (
    Explanation,
    explain_command,
    explanation,
    fmt_cost,
    mechanism_counts,
    stabilised,
)
from flakecheck.reports.facts import (
    CONFIDENT_NOTE,
    TP_ONLY_NOTE,
    RunFacts,
    empty_answer_warning,
    flip_summary,
    fmt_gap,
    fmt_rate,
    fmt_step,
    gather,
    next_command,
    score_range,
)
from flakecheck.reports.flip_view import fmt_observed, fmt_predicted, prediction_note

STATUS_STYLE = {"stable": "green", "fragile": "yellow", "flaky": "magenta", "verdict_flaky": "bold red"}


def summary_line(run: RunData) -> str:
    """One line, e.g. 'demo: 104 cases · 71 stable · 12 fragile · ... (splitk, 6 compositions) -> DIR'."""
    facts = gather(run)
    counts = " · ".join(f"{facts.counts[s]} {s}" for s in STATUSES)
    return (f"{facts.suite_name}: {facts.n_cases} cases · {counts} "
            f"({facts.policy}, {len(facts.compositions)} compositions) -> {facts.path}")


def render_summary(run: RunData, console: Console, top: int = 10) -> None:
    """Counts per status, verdict flips, the riskiest cases, where the run is, what to run next."""
    facts = gather(run)
    console.print(_header(facts))
    if facts.engine.verified:
        console.print(f"[dim]machine: {escape(facts.engine.verified)}[/]")
    console.print(_counts_table(facts))
    warning = empty_answer_warning(facts)
    if warning:
        console.print(f"[bold yellow]warning:[/] {escape(warning)}")
    if facts.verdict_flips:
        shown = ", ".join(escape(str(c)) for c in facts.verdict_flips[:20])
        more = f" (+{len(facts.verdict_flips) - 20} more)" if len(facts.verdict_flips) > 20 else ""
        console.print(f"[bold red]verdict flips ({len(facts.verdict_flips)}):[/] {shown}{more}")
    else:
        console.print("[green]no verdict flips[/]: every case grades the same under every composition")
    if facts.tp_only_flips:
        shown = ", ".join(escape(str(c)) for c in facts.tp_only_flips[:20])
        more = f" (+{len(facts.tp_only_flips) - 20} more)" if len(facts.tp_only_flips) > 20 else ""
        console.print(f"[bold red]TP-only flips ({len(facts.tp_only_flips)}):[/] {shown}{more} — "
                      f"{escape(TP_ONLY_NOTE)}")
    for line in score_lines(facts):
        console.print(line)
    flips = flip_summary(facts)
    if flips:
        console.print(escape(flips))
    render_flip(facts, console)
    if facts.confident_flips:
        shown = ", ".join(escape(c) for c in facts.confident_flips[:20])
        more = f" (+{len(facts.confident_flips) - 20} more)" if len(facts.confident_flips) > 20 else ""
        console.print(f"[bold red]confident flips ({len(facts.confident_flips)}):[/] {shown}{more} — "
                      f"{escape(CONFIDENT_NOTE)}")
    risky = facts.top(top)
    if risky:
        console.print(_top_table(risky, facts))
    explained = explanation(run)
    if explained is not None:
        render_explanation(explained, console, top)
    elif facts.n_diverged and facts.record.source == "engine":
        console.print(f"why they flipped, and the cheapest fix: [cyan]{escape(explain_command(run))}[/]",
                      soft_wrap=True)
    timing = replay_line(facts.record)
    if timing:
        console.print(escape(timing))
    console.print(f"run directory: [bold]{escape(str(facts.path))}[/]")
    html = facts.path / "report.html"
    if html.is_file():
        console.print(f"HTML report:   {escape(str(html))}")
    why, command = next_command(facts)
    console.print(f"next, {escape(why)}:\n  [bold cyan]{escape(command)}[/]", soft_wrap=True)


def replay_line(record: RunRecord) -> str | None:
    """How the traces were produced and how long it took: 'replay: simulated, 6,235 engine steps of every
    composition in 349 shared forward passes (12,531 of 46,033 rows computed once for several), 2 min 43 s';
    None for a run directory that does not record it."""
    seconds = record.timings.get("replay_s")
    mode = record.details.get("replay")
    if seconds is None or mode is None:
        return None
    stats = record.details.get("replay_stats") or {}
    minutes, rest = divmod(round(seconds), 60)
    took = f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"
    if mode == "simulated" and stats.get("steps") and stats.get("forward_passes"):
        shared = stats.get("shared_rows") or 0
        total = shared + stats.get("rows", 0) + stats.get("skipped_rows", 0)
        rows = f" ({shared:,} of {total:,} rows computed once for several)" if shared else ""
        return (f"replay: simulated, {stats['steps']:,} engine steps of every composition in "
                f"{stats['forward_passes']:,} shared forward passes{rows}, {took}")
    if mode == "simulated" and cluster_words(stats):
        return f"replay: simulated{cluster_words(stats)}, {took}"
    fallback = f" — {stats['fallback']}" if stats.get("fallback") else ""
    return f"replay: {mode}, {took}{fallback}"


def cluster_words(stats: dict) -> str:
    """' on a Ray cluster of 2 actors (8 shards, 1 rerun after a lost actor)', or '' without a cluster."""
    cluster = stats.get("cluster")
    if not isinstance(cluster, dict):
        return ""
    reruns = cluster.get("retries") or 0
    rerun = f", {reruns} rerun{'s' if reruns != 1 else ''} after a lost actor" if reruns else ""
    return f" on a Ray cluster of {len(cluster.get('workers') or [])} actors ({cluster.get('shards', 0)} shards{rerun})"


def score_lines(facts: RunFacts) -> list[str]:
    """The score swing, as rich markup: the sentence, then the per-composition range."""
    score = facts.score
    if not score.n_graded:
        return []
    if not score.swing_pp:
        return [f"[green]score swing[/]: {escape(swing_sentence(score))} ({score.n_graded} graded cases)"]
    return [f"[bold red]score swing[/]: {escape(swing_sentence(score))}",
            f"  score per composition {escape(score_range(score) or '—')}; {score.n_graded} graded cases"]


def _header(facts: RunFacts) -> str:
    compositions = ", ".join(facts.composition_label(c) for c in facts.compositions)
    return (f"[bold]{escape(facts.suite_name)}[/]: {facts.n_cases} cases · model {escape(facts.model)} "
            f"({escape(facts.dtype)}) · kernels [bold]{escape(facts.policy)}[/] ({escape(facts.runs_on)}, "
            f"profile {escape(facts.profile)}) · compositions {escape(compositions)} "
            f"(reference {escape(facts.reference)})")


def _counts_table(facts: RunFacts) -> Table:
    table = Table(title="cases per status", title_justify="left", show_edge=False)
    table.add_column("status")
    table.add_column("cases", justify="right")
    table.add_column("share", justify="right")
    for status in STATUSES:
        n = facts.counts[status]
        share = n / facts.n_cases if facts.n_cases else 0.0
        table.add_row(f"[{STATUS_STYLE[status]}]{status}[/]", str(n), fmt_rate(share))
    return table


def render_flip(facts: RunFacts, console: Console) -> None:
    """Flip probability over the draws: the source, agreement, score under load, calibration and its bins."""
    note = prediction_note(facts.record.flip)
    if note:
        console.print(escape(note), soft_wrap=True)
    view = facts.flip
    if view is None:
        return
    for line in view.lines():
        console.print(escape(line), soft_wrap=True)
    bins = [b for b in view.bins() if b["n"]]
    if bins:
        table = Table(title="reliability (cases binned by predicted flip probability)", title_justify="left",
                      show_edge=False)
        for name in ("predicted", "cases", "mean predicted", "mean observed"):
            table.add_column(name, justify="left" if name == "predicted" else "right")
        for b in bins:
            table.add_row(f"{b['low']:.1f}–{b['high']:.1f}", str(b["n"]), f"{b['mean_predicted']:.3f}",
                          f"{b['mean_observed']:.3f}")
        console.print(table)


def _top_table(risky: list[dict], facts: RunFacts) -> Table:
    table = Table(title=f"top {len(risky)} cases by flip probability", title_justify="left", show_edge=False)
    # short headers: the table must stay readable in an 80-column terminal
    observed = facts.flip is not None
    for name, justify in (("case", "left"), ("status", "left"), ("p flip [95%]" if observed else "", "right"),
                          ("pred", "right"), ("step", "right"),
                          ("where", "left"), ("ref -> alt", "left"), ("gap", "right"), ("flip", "left"),
                          ("min gap", "right"), ("pass", "right")):
        # case ids get pasted into commands: the other columns fold first
        if name:
            table.add_column(name, justify=justify, overflow="fold", no_wrap=name == "case")
    for c in risky:
        pair = "—"
        if c["ref_token"] is not None or c["alt_token"] is not None:
            pair = f"{_token(c['ref_token'])} -> {_token(c['alt_token'])}"
        probabilities = ([fmt_observed(c)] if observed else []) + [fmt_predicted(c)]
        table.add_row(
            escape(str(c["case_id"])), f"[{STATUS_STYLE.get(c['status'], '')}]{c['status']}[/]",
            *probabilities, fmt_step(c["first_divergence"]),
            escape(c["divergence_composition"] or "—"), escape(pair), fmt_gap(c["gap_at_divergence"]),
            _flip(c.get("flip_kind")), fmt_gap(c["min_gap"]), fmt_rate(c["pass_rate"]),
        )
    return table


def _flip(kind: str | None) -> str:
    if kind is None:
        return "—"
    return f"[bold red]{kind}[/]" if kind == "confident" else kind


def _token(text: str | None) -> str:
    """A token as a visible literal: repr shows leading spaces and newlines that matter here."""
    return "?" if text is None else repr(text)



def render_explanation(facts: Explanation, console: Console, top: int = 10) -> None:
    """What `flakecheck explain` found: which mechanisms alone reproduce each flip, and the ranked fixes."""
    n = len(facts.cases)
    if not n:
        console.print("[green]explain[/]: no diverged case to explain")
        return
    console.print(f"[bold]why they flipped[/] ({n} diverged case{'s' if n != 1 else ''}, each replayed to its first "
                  f"divergence + {facts.steps_after} with one mechanism variable): cases each mechanism alone "
                  f"reproduces, of those where it varies:")
    console.print(f"  {escape(mechanism_counts(facts))}", soft_wrap=True)
    table = Table(title_justify="left", show_edge=False)
    for name, justify in (("case", "left"), ("step", "right"), ("where", "left"), ("kernels", "left"),
                          ("scheduling", "left")):
        table.add_column(name, justify=justify, overflow="fold", no_wrap=name == "case")
    for case in facts.cases[:max(top, 0)]:
        table.add_row(escape(case.case_id), fmt_step(case.step), escape(case.where or "—"),
                      _mechanism(case.reduction), _mechanism(case.scheduling))
    if top > 0:
        console.print(table)
    if len(facts.cases) > top:
        console.print(f"  … {len(facts.cases) - top} more in attribution.parquet")
    if facts.fixes:
        console.print(_fix_table(facts))
        for fix in facts.fixes:
            console.print(f"  {fix['rank']}. {escape(fix['label'])}: {escape(fix['cost'])}; "
                          f"vLLM {escape(fix['vllm'])}; SGLang {escape(fix['sglang'])}", soft_wrap=True)
    line = facts.cost_line()
    if line:
        console.print(escape(line))


def _mechanism(text: str | None) -> str:
    if text is None:
        return "—"
    return f"[yellow]{escape(text)}[/]" if text == "interaction" else escape(text)


def _fix_table(facts: Explanation) -> Table:
    table = Table(title="smallest fix (replayed, cheapest full fix first)", title_justify="left", show_edge=False)
    for name, justify in (("#", "right"), ("fix", "left"), ("stabilises", "right"), ("verdict flips", "right"),
                          ("cost", "right")):
        table.add_column(name, justify=justify, overflow="fold")
    for fix in facts.fixes:
        style = "green" if fix["full_fix"] else ""
        table.add_row(str(fix["rank"]), f"[{style}]{escape(fix['label'])}[/]" if style else escape(fix["label"]),
                      stabilised(fix), f"{fix['verdict_flips_before']} -> {fix['verdict_flips_after']}", fmt_cost(fix))
    return table
