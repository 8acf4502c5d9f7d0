"""Small inline SVG bar charts for the HTML report: no plotting library, no network, escaped labels."""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass
class Series:
    name: str
    values: list[float]
    colour: str


def bar_chart(title: str, labels: list[str], series: list[Series], x_label: str = "", y_label: str = "cases",
              width: int = 380, height: int = 200, label_colours: list[str] | None = None) -> Markup:
    """Grouped vertical bars, one group per label; every bar has a <title> so hovering gives its value."""
    left, right, bottom = 34, 8, 42
    top = 26 + 12 * (len(series) - 1)  # room for the legend above the bars
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([v for s in series for v in s.values] + [1])
    group_w = plot_w / max(len(labels), 1)
    bar_w = max(group_w * 0.8 / max(len(series), 1), 1.0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}"><title>{escape(title)}</title>',
             f'<text x="{left}" y="14" class="chart-title">{escape(title)}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>',
             f'<text x="{left - 4}" y="{top + 4}" class="tick" text-anchor="end">{_num(peak)}</text>',
             f'<text x="{left - 4}" y="{top + plot_h}" class="tick" text-anchor="end">0</text>']
    for g, label in enumerate(labels):
        x0 = left + g * group_w + group_w * 0.1
        for s_index, s in enumerate(series):
            value = s.values[g]
            h = plot_h * value / peak
            colour = label_colours[g] if label_colours and len(series) == 1 else s.colour
            x = x0 + s_index * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{max(bar_w - 1, 0.5):.1f}" '
                f'height="{h:.1f}" fill="{colour}"><title>{escape(label)}: {_num(value)} '
                f'{escape(s.name)}</title></rect>'
            )
        if len(labels) <= 16 or g % max(len(labels) // 8, 1) == 0:
            short = label if len(label) <= 9 else label[:8] + "…"
            parts.append(f'<text x="{left + (g + 0.5) * group_w:.1f}" y="{top + plot_h + 13}" class="tick" '
                         f'text-anchor="middle">{escape(short)}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" class="axis-label" '
                 f'text-anchor="middle">{escape(x_label)}</text>')
    if len(series) > 1:
        for i, s in enumerate(series):
            x = left + plot_w - 120
            y = 12 + 12 * i
            parts.append(f'<rect x="{x}" y="{y - 8}" width="9" height="9" fill="{s.colour}"/>'
                         f'<text x="{x + 13}" y="{y}" class="tick">{escape(s.name)}</text>')
    parts.append(f'<text x="10" y="{top + plot_h / 2:.1f}" class="axis-label" text-anchor="middle" '
                 f'transform="rotate(-90 10 {top + plot_h / 2:.1f})">{escape(y_label)}</text></svg>')
    return Markup("".join(parts))


def _num(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.2f}"


def reliability_chart(title: str, bins: list[dict], width: int = 380, height: int = 220) -> Markup:
    """Predicted (x) against observed (y) flip probability: the diagonal is perfect calibration, each non-empty
    bin a dot at (mean predicted, mean observed) sized by its case count, with the count as its <title>."""
    left, right, top, bottom = 38, 10, 26, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    biggest = max([b["n"] for b in bins] + [1])

    def x(v: float) -> float:
        return left + plot_w * v

    def y(v: float) -> float:
        return top + plot_h * (1 - v)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}"><title>{escape(title)}</title>',
             f'<text x="{left}" y="14" class="chart-title">{escape(title)}</text>',
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(0)}" class="axis"/>',
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(0)}" y2="{y(1)}" class="axis"/>',
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" stroke="#999" stroke-dasharray="4 3"/>']
    for tick in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{x(tick):.1f}" y="{y(0) + 13:.1f}" class="tick" text-anchor="middle">{tick:g}</text>'
                     f'<text x="{x(0) - 4:.1f}" y="{y(tick) + 4:.1f}" class="tick" text-anchor="end">{tick:g}</text>')
    for b in bins:
        if not b["n"] or b["mean_predicted"] is None or b["mean_observed"] is None:
            continue
        r = 3 + 7 * (b["n"] / biggest) ** 0.5
        tip = (f"predicted {b['low']:.1f}–{b['high']:.1f}: {b['n']} cases, mean predicted "
               f"{b['mean_predicted']:.3f}, mean observed {b['mean_observed']:.3f}")
        parts.append(f'<circle cx="{x(b["mean_predicted"]):.1f}" cy="{y(b["mean_observed"]):.1f}" r="{r:.1f}" '
                     f'fill="#5b8def" fill-opacity="0.75"><title>{escape(tip)}</title></circle>'
                     f'<text x="{x(b["mean_predicted"]) + r + 2:.1f}" y="{y(b["mean_observed"]) + 4:.1f}" '
                     f'class="tick">{b["n"]}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" class="axis-label" text-anchor="middle">'
                 f'predicted (bin mean; dot size and label: cases)</text>')
    parts.append(f'<text x="10" y="{top + plot_h / 2:.1f}" class="axis-label" text-anchor="middle" '
                 f'transform="rotate(-90 10 {top + plot_h / 2:.1f})">observed</text></svg>')
    return Markup("".join(parts))
