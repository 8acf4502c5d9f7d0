"""The pictures of the HTML report, as inline SVG: min-gap distribution, first-divergence steps, flips per
composition, and (a run with draws) the reliability of predicted against observed flip probability."""

from __future__ import annotations

import math

from markupsafe import Markup

from flakecheck.data.rundir import RunData
from flakecheck.reports.facts import RunFacts
from flakecheck.reports.svg import Series, bar_chart

# Gap bins in nats, finer near zero where near-ties live.
GAP_EDGES = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, math.inf]
TIE, CLOSE, CALM = "#d6453d", "#f0a03c", "#5b8def"
MAX_STEP_BARS = 40


def plots(run: RunData, facts: RunFacts) -> list[Markup]:
    reliability = facts.flip.reliability_plot() if facts.flip is not None else None
    return [min_gap_plot(facts), first_divergence_plot(run), flips_plot(facts)] + ([reliability] if reliability else [])


def min_gap_plot(facts: RunFacts) -> Markup:
    gaps = [c["min_gap"] for c in facts.cases if c["min_gap"] is not None]
    labels, counts, colours = [], [], []
    for low, high in zip(GAP_EDGES, GAP_EDGES[1:]):
        labels.append(f"≥{low:g}" if math.isinf(high) else f"<{high:g}")
        counts.append(float(sum(low <= g < high for g in gaps)))
        colours.append(TIE if high <= facts.gap_threshold else CLOSE if high <= 4 * facts.gap_threshold else CALM)
    return bar_chart("min top-1/top-2 gap per case", labels, [Series("cases", counts, CALM)],
                     x_label=f"gap (nats); red = near-tie (< {facts.gap_threshold:g})", label_colours=colours)


def first_divergence_plot(run: RunData) -> Markup:
    """Every divergent (case, composition, repeat) output by the step where it left the reference."""
    steps = [int(s) for s in run.runs["first_divergence"].dropna()]
    if not steps:
        return bar_chart("first divergence step", ["none"], [Series("outputs", [0.0], TIE)],
                         x_label="no output diverged", y_label="outputs")
    width = max(1, math.ceil((max(steps) + 1) / MAX_STEP_BARS))
    n_bins = max(steps) // width + 1
    counts = [0.0] * n_bins
    for s in steps:
        counts[s // width] += 1
    labels = [str(i * width) if width == 1 else f"{i * width}-{i * width + width - 1}" for i in range(n_bins)]
    return bar_chart("first divergence step", labels, [Series("outputs", counts, TIE)],
                     x_label="generated-token step where the output first differs", y_label="outputs")


def flips_plot(facts: RunFacts) -> Markup:
    others = [c for c in facts.compositions if not c.is_reference]
    labels = [c.name for c in others] or ["(only the reference)"]
    diverged = [float(c.diverged_cases) for c in others] or [0.0]
    changed = [float(c.verdict_changes) for c in others] or [0.0]
    return bar_chart(f"flips per composition (vs {facts.reference})", labels,
                     [Series("diverged", diverged, CLOSE), Series("verdict changed", changed, TIE)],
                     x_label="composition")
