"""report.html: one self-contained file (inline CSS, JS and SVG; a CSP that forbids any fetch).

All suite and model text goes through jinja2 autoescaping; the one JSON blob inside <script> has
`<`, `>` and `&` written as \\u escapes, so a `</script>` in a prompt cannot end the script.

Size is bounded for large suites (HtmlLimits): every case gets one summary row in the table, but
token-level detail is kept only for `detail_cases` non-stable cases (diverged ones first, then
fragile ones, each by flip probability), and within each of those for the first `tokens_per_output` tokens
of at most `alternatives_per_case` distinct divergent outputs; prompts and output texts are cut
at `text_chars` characters. Measured: 2,000 cases (6 compositions, 8 tokens) give 2.3 MB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from flakecheck.analysis.divergence import first_divergence
from flakecheck.analysis.score_swing import swing_sentence
from flakecheck.data.rundir import STATUSES, RunData, atomic_write_text
from flakecheck.data.traces import run_label
from flakecheck.reports.explanation import explanation, fmt_cost, mechanism_counts, stabilised
from flakecheck.reports.facts import (
    CONFIDENT_NOTE,
    DIVERGED,
    TP_ONLY_NOTE,
    RunFacts,
    clean,
    empty_answer_warning,
    flip_summary,
    fmt_gap,
    fmt_rate,
    fmt_step,
    gather,
    prompt_text,
    records,
    score_range,
    suite_cases,
)
from flakecheck.reports.flip_view import fmt_observed, fmt_predicted, prediction_note
from flakecheck.reports.plots import plots

TEMPLATES = Path(__file__).parent / "templates"
MAX_METADATA_COLUMNS = 6
MAX_FILTER_VALUES = 30
PROMPT_PREVIEW = 60  # characters of the input shown in the case table


@dataclass(frozen=True)
class HtmlLimits:
    detail_cases: int = 60
    tokens_per_output: int = 200
    alternatives_per_case: int = 4
    text_chars: int = 4000


@dataclass
class TokenView:
    text: str
    step: int
    css: str
    tip: str


@dataclass
class OutputView:
    label: str
    compositions: list[str]
    passed: bool | None
    finish_reason: str | None
    n_tokens: int
    divergence: int | None
    tokens: list[TokenView]
    hidden_tokens: int
    text: str


@dataclass
class CaseDetail:
    anchor: str
    case: dict[str, Any]
    prompt: str
    targets: list[Any]
    checks: list[Any]
    metadata: dict[str, Any]
    reference: OutputView | None
    alternatives: list[OutputView]
    hidden_alternatives: int


def write_html(run: RunData, path: Path) -> None:
    atomic_write_text(path, render_html(run))


def render_html(run: RunData, limits: HtmlLimits = HtmlLimits()) -> str:
    facts = gather(run)
    suite = suite_cases(facts.record)
    metadata_keys = _metadata_keys(suite)
    # diverged cases first (their outputs differ: the most to see), then fragile ones, each by flip probability
    diverged = [c["case_id"] for c in facts.cases if c["status"] in DIVERGED]
    fragile = [c["case_id"] for c in facts.cases if c["status"] not in DIVERGED and c["status"] != "stable"]
    detail_ids = (diverged + fragile)[:limits.detail_cases]
    anchors = {case_id: f"case-{i}" for i, case_id in enumerate(detail_ids)}
    details = _details(run, facts, suite, anchors, limits)
    rows = [_row(c, suite.get(str(c["case_id"]), {}), metadata_keys, anchors.get(c["case_id"])) for c in facts.cases]
    data = {"n_cases": facts.n_cases, "statuses": list(STATUSES), "counts": facts.counts,
            "metadata_keys": metadata_keys, "suite_name": facts.suite_name, "model": facts.model}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["token_repr"] = token_repr
    template = env.get_template("report.html.j2")
    return template.render(
        facts=facts, statuses=STATUSES, rows=rows, details=details, metadata_keys=metadata_keys,
        metadata_filters=_metadata_filters(rows, metadata_keys), plots=plots(run, facts),
        limits=limits, n_detail_candidates=sum(1 for c in facts.cases if c["status"] != "stable"),
        data_json=script_json(data), css=Markup((TEMPLATES / "report.css").read_text()),
        js=Markup((TEMPLATES / "report.js").read_text()), fmt_gap=fmt_gap, fmt_step=fmt_step,
        fmt_rate=fmt_rate, flaky_rate=fmt_rate(facts.flaky_rate), meta_json=_pretty_meta(run.meta),
        empty_warning=empty_answer_warning(facts), score=facts.score, score_sentence=swing_sentence(facts.score),
        score_range=score_range(facts.score), flip_summary=flip_summary(facts), confident_note=CONFIDENT_NOTE,
        explained=explanation(run), mechanism_counts=mechanism_counts, fmt_cost=fmt_cost, stabilised=stabilised,
        flip=facts.flip, fmt_observed=fmt_observed, fmt_predicted=fmt_predicted,
        prediction_note=prediction_note(facts.record.flip),  # which noise predicted: the server's or a profile's
        tp_only_note=TP_ONLY_NOTE,
    )


def script_json(obj: Any) -> Markup:
    """JSON that is safe inside <script>: no `<`, `>` or `&` survives, so nothing can close the tag."""
    text = json.dumps(obj, ensure_ascii=False, default=str, allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def token_repr(value: str | None) -> str:
    """A token as a literal, so leading spaces and newlines are visible."""
    return "?" if value is None else repr(value)


def _pretty_meta(meta: dict[str, Any]) -> str:
    """meta.json without the per-case list (already shown per case) for the 'run settings' section."""
    slim = {k: v for k, v in meta.items() if k != "cases"}
    return json.dumps(slim, indent=2, sort_keys=True, default=str)


def _metadata_keys(suite: dict[str, dict[str, Any]]) -> list[str]:
    """The most common metadata keys across cases: one table column and one filter each."""
    counts: dict[str, int] = {}
    for case in suite.values():
        for key in (case.get("metadata") or {}):
            counts[str(key)] = counts.get(str(key), 0) + 1
    return sorted(counts, key=lambda k: (-counts[k], k))[:MAX_METADATA_COLUMNS]


def _metadata_value(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _row(case: dict[str, Any], suite_case: dict[str, Any], keys: list[str], anchor: str | None) -> dict[str, Any]:
    metadata = suite_case.get("metadata") or {}
    values = {k: _metadata_value(metadata.get(k)) for k in keys}
    prompt = " ".join(prompt_text(suite_case.get("input")).split())
    search = " ".join([str(case["case_id"]), case["status"], *values.values(), prompt]).lower()
    return {"case": case, "anchor": anchor, "metadata": values, "search": search,
            "prompt": _preview(prompt, PROMPT_PREVIEW), "prompt_title": _preview(prompt, 10 * PROMPT_PREVIEW)}


def _metadata_filters(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, list[str]]:
    """A drop-down per metadata key with few distinct values (free text goes to the search box)."""
    filters = {}
    for key in keys:
        values = sorted({r["metadata"][key] for r in rows if r["metadata"][key]})
        if 1 < len(values) <= MAX_FILTER_VALUES:
            filters[key] = values
    return filters


def _details(run: RunData, facts: RunFacts, suite: dict[str, dict[str, Any]], anchors: dict[str, str],
             limits: HtmlLimits) -> list[CaseDetail]:
    if not anchors:
        return []
    wanted = set(anchors)
    runs = run.runs[run.runs["case_id"].isin(wanted)]
    tokens = run.tokens[run.tokens["case_id"].isin(wanted) & (run.tokens["step"] < limits.tokens_per_output)]
    vocab = _vocab(run)
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for t in records(tokens.sort_values("step")):
        by_key.setdefault((t["case_id"], t["composition"], t["repeat"]), []).append(t)
    order = {name: i for i, name in enumerate(facts.composition_names)}
    by_id = {c["case_id"]: c for c in facts.cases}
    details = []
    for case_id, anchor in anchors.items():
        case_runs = runs[runs["case_id"] == case_id].copy()
        case_runs["_order"] = case_runs["composition"].map(lambda n: order.get(n, len(order)))
        case_runs = case_runs.sort_values(["repeat", "_order"])
        details.append(_detail(case_id, anchor, by_id[case_id], case_runs, by_key, vocab, facts, suite, limits))
    return details


def _detail(case_id: str, anchor: str, case: dict[str, Any], case_runs: pd.DataFrame, by_key: dict,
            vocab: dict[int, str], facts: RunFacts, suite: dict[str, dict[str, Any]],
            limits: HtmlLimits) -> CaseDetail:
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    rows_ = records(case_runs)
    for row in rows_:
        groups.setdefault(tuple(int(t) for t in row["token_ids"]), []).append(row)
    reference_rows = [r for r in rows_ if r["composition"] == facts.reference]
    ref_ids = tuple(int(t) for t in reference_rows[0]["token_ids"]) if reference_rows else next(iter(groups), ())
    alternatives = []
    for ids, rows in groups.items():
        if ids == ref_ids:
            continue
        alternatives.append((first_divergence(ref_ids, ids), ids, rows))  # differs: not None
    alternatives.sort(key=lambda a: (a[0], -len(a[2])))
    shown = alternatives[:limits.alternatives_per_case]
    ref_marks = {step for step, _, _ in shown}
    reference = None
    if ref_ids in groups:
        reference = _output(f"reference ({facts.reference})", groups[ref_ids], None, ref_marks, by_key, vocab,
                            facts, limits)
    views = [_output(f"alternative {i + 1}", rows, step, {step}, by_key, vocab, facts, limits)
             for i, (step, _, rows) in enumerate(shown)]
    suite_case = suite.get(str(case_id), {})
    prompt = prompt_text(suite_case.get("input"))
    return CaseDetail(
        anchor=anchor, case=case, prompt=_cut(prompt, limits.text_chars),
        targets=list(suite_case.get("targets") or []), checks=list(suite_case.get("checks") or []),
        metadata=dict(suite_case.get("metadata") or {}), reference=reference, alternatives=views,
        hidden_alternatives=len(alternatives) - len(shown),
    )


def _output(label: str, rows: list[dict[str, Any]], divergence: int | None, marks: set[int], by_key: dict,
            vocab: dict[int, str], facts: RunFacts, limits: HtmlLimits) -> OutputView:
    first = rows[0]
    compositions = [run_label(r["composition"], int(r["repeat"])) for r in rows]
    tokens = [_token(t, divergence, marks, vocab, facts.gap_threshold)
              for t in by_key.get((first["case_id"], first["composition"], first["repeat"]), [])]
    n_tokens = int(first["n_tokens"])
    return OutputView(
        label=label, compositions=compositions, passed=clean(first["passed"]),
        finish_reason=clean(first["finish_reason"]), n_tokens=n_tokens, divergence=divergence, tokens=tokens,
        hidden_tokens=max(n_tokens - len(tokens), 0), text=_cut(str(clean(first["text"]) or ""), limits.text_chars),
    )


def _token(t: dict[str, Any], divergence: int | None, marks: set[int], vocab: dict[int, str],
           threshold: float) -> TokenView:
    step = int(t["step"])
    gap = clean(t["gap"])
    classes = [_gap_class(gap, threshold)]
    if step in marks:
        classes.append("div")
    if divergence is not None:
        classes.append("same" if step < divergence else "after")
    text = str(clean(t["token"]) or "")
    visible = text.replace("\n", "↵\n").replace("\t", "→\t") or "∅"
    top1 = f"{_tok(vocab, clean(t['top1_id']))} ({_lp(clean(t['top1_logprob']))})"
    top2 = f"{_tok(vocab, clean(t['top2_id']))} ({_lp(clean(t['top2_logprob']))})"
    tip = f"step {step} · gap {fmt_gap(gap)}\n1st: {top1}\n2nd: {top2}"
    if clean(t["token_id"]) != clean(t["top1_id"]):
        tip += f"\nchosen: {text!r}"
    return TokenView(text=visible, step=step, css=" ".join(c for c in classes if c), tip=tip)


def _gap_class(gap: float | None, threshold: float) -> str:
    """Colour bands: a near-tie (< threshold), close (< 4x), noticeable (< 1 nat), else confident."""
    if gap is None:
        return ""
    if gap < threshold:
        return "g0"
    if gap < 4 * threshold:
        return "g1"
    return "g2" if gap < 1.0 else ""


def _vocab(run: RunData) -> dict[int, str]:
    """Token texts from the run itself (the run directory has no tokenizer): generated tokens and,
    when the run recorded them, the top-2 candidates' texts; any other id is shown by its id."""
    vocab: dict[int, str] = {}
    if "top2_token" in run.tokens:
        pairs = run.tokens[["top2_id", "top2_token"]].dropna().drop_duplicates("top2_id")
        vocab.update((int(i), str(t)) for i, t in zip(pairs["top2_id"], pairs["top2_token"]))
    pairs = run.tokens[["token_id", "token"]].drop_duplicates("token_id")
    vocab.update((int(i), str(t)) for i, t in zip(pairs["token_id"], pairs["token"]))
    return vocab


def _tok(vocab: dict[int, str], token_id: int | None) -> str:
    if token_id is None:
        return "?"
    return repr(vocab[token_id]) if token_id in vocab else f"id {token_id}"


def _lp(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def _preview(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"
