"""The conformance table as markdown (conformance.md, `--format markdown`) and as terminal lines, from the
data conformance.json holds (so a copied directory renders without the server)."""

from __future__ import annotations

from typing import Any

from flakecheck.probe.conformance.plan import AXIS_TITLES

READING_TEXT = {"holds": "holds", "tokens_hold": "tokens hold", "breaks": "breaks", "not_isolated": "not isolated",
                "unsupported": "not supported"}


def _cell(text: Any) -> str:
    """Server text (a model name, a version) in a table cell: no pipe or newline can break the table."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def axis_detail(axis: dict[str, Any]) -> str:
    """`3 of 36: first at n8 (t2, step 5, gap 0.000, tie)`; for a holding axis, how many were compared."""
    levels = axis["levels"]
    if axis["reading"] == "unsupported":
        return "; ".join(lv["unsupported"] or "" for lv in levels)[:200]
    parts = [f"{axis['breaks']} of {axis['compared']} answers differ in tokens"]
    tokens_hold = sum(lv["tokens_hold"] for lv in levels)
    if tokens_hold:
        parts.append(f"{tokens_hold} differ in logprobs only")
    first = axis.get("first_break")
    if first:
        gap = "—" if first["gap"] is None else f"{first['gap']:.3f}"
        parts.append(f"first at {axis['breaks_at']} ({first['target']}, step {first['first_divergence']}, gap {gap}, "
                     f"{first['flip_kind'] or 'unknown'})")
    skipped = [lv["level"] for lv in levels if lv["reading"] == "unsupported"]
    if skipped:
        parts.append(f"not supported by the server: {', '.join(skipped)}")
    return "; ".join(parts)


def level_cells(axis: dict[str, Any]) -> str:
    return " ".join(f"{lv['level']}:{READING_TEXT[lv['reading']]}" for lv in axis["levels"])


def conformance_markdown(data: dict[str, Any]) -> str:
    server = data["server"]
    lines = [
        "## Server conformance", "",
        f"Server `{_cell(server['endpoint'])}` · model `{_cell(server['model'])}` · version "
        f"`{_cell(server['version'] or 'unknown')}` · system_fingerprint "
        f"`{_cell(', '.join(server['system_fingerprints']) or 'none')}`", "",
        "| axis | reading | levels | detail |", "|---|---|---|---|",
    ]
    if data.get("sizes_capped_at"):
        lines[4:4] = [_capped(data), ""]
    for axis in data["axes"]:
        detail = axis_detail(axis) + (f" — {axis['note']}" if axis.get("note") else "")
        reading = READING_TEXT[axis["reading"]]
        lines.append(f"| {AXIS_TITLES[axis['axis']]} | **{reading}** | {_cell(level_cells(axis))} | {_cell(detail)} |")
    lines.append("")
    if data.get("expect"):
        verdict = ("passed" if not data["failed"] else
                   "failed — not holding: " + ", ".join(AXIS_TITLES[a] for a in data["failed"]))
        lines += [f"Expected `{data['expect']}`: {verdict}.", ""]
    lines.append(f"{data['requests']} requests in {data['seconds']:.0f} s; noise profile: `{data['noise']['file']}`.")
    return "\n".join(lines) + "\n"


def conformance_lines(data: dict[str, Any]) -> list[str]:
    """The terminal summary: one line per axis, then the expectation."""
    lines = [f"{AXIS_TITLES[a['axis']]:<22} {READING_TEXT[a['reading']]:<13} {axis_detail(a)}"
             + (f" — {a['note']}" if a.get("note") else "") for a in data["axes"]]
    if data.get("sizes_capped_at"):
        lines.append(_capped(data))
    if data.get("expect"):
        if data["failed"]:
            lines.append(f"expected {data['expect']}: FAILED — "
                         + "; ".join(f"{AXIS_TITLES[a]} {_reading_of(data, a)}" for a in data["failed"]))
        else:
            lines.append(f"expected {data['expect']}: passed")
    return lines


def _reading_of(data: dict[str, Any], name: str) -> str:
    axis = next(a for a in data["axes"] if a["axis"] == name)
    where = f" at {axis['breaks_at']}" if axis.get("breaks_at") else ""
    return f"{READING_TEXT[axis['reading']]}{where}"


def _capped(data: dict[str, Any]) -> str:
    cap = data["sizes_capped_at"]
    return (f"Co-resident sizes up to {max(data['sizes'])}: the server runs at most {cap} sequences a step (its "
            f"max_num_seqs), "
            f"so more in flight would wait in its queue, not share its steps.")
