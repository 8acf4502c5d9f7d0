"""The last stage every source of traces shares (a replay through the built-in engine, a probe of a
server): analyse the traces and write the run directory's tables and meta.json."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from flakecheck.analysis.divergence import Thresholds, analyse
from flakecheck.analysis.flip.summary import flip_meta
from flakecheck.analysis.verdicts import grade_traces
from flakecheck.data.rundir import RunData, RunDirectory
from flakecheck.data.suite import Suite
from flakecheck.data.traces import Trace, VerdictKey, traces_digest
from flakecheck.grading.checks import check_label
from flakecheck.machine.fingerprint import software_versions


@dataclass(frozen=True)
class TokenTexts:
    """How the source turns token ids into text: a whole output, and one token (for tables and reports)."""

    decode: Callable[[list[int]], str]
    token: Callable[[int], str]


def write_run(directory: RunDirectory, suite: Suite, traces: Sequence[Trace], reference: str,
              thresholds: Thresholds, texts: TokenTexts, meta: dict[str, Any],
              timings: dict[str, float], verdicts: Mapping[VerdictKey, bool | None] | None = None,
              draws: Sequence[str] = (), sampling: Mapping[str, Any] | None = None) -> RunData:
    """Analyse, write runs/tokens/cases parquet and meta.json (the source's `meta` plus what every run
    records), drop the saved partial traces. `verdicts` are every trace's pass/fail, graded before
    (flakecheck.analysis.verdicts; None: the suite's own checks grade here). `meta["dtype"]` (the logits' dtype,
    unknown for a server) sizes one ulp for flip_kind. The caller's `timings` gain analysis_s. `draws`: the
    compositions that are draws from a load (flakecheck.analysis.flip), `sampling` how they were drawn."""
    if verdicts is None:
        t0 = time.perf_counter()
        verdicts = grade_traces(traces, suite.cases, texts.decode)
        timings["grading_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = analyse(traces, suite.cases, reference, thresholds, texts.decode, texts.token, verdicts=verdicts,
                     dtype=meta.get("dtype"), draws=frozenset(draws))
    flip = flip_meta(tables.cases, tables.runs, reference, list(draws), tables.noise, sampling)
    timings["analysis_s"] = time.perf_counter() - t0
    directory.write_tables(tables.runs, tables.tokens, tables.cases)
    generated = sum(len(r["token_ids"]) for r in tables.runs)
    timings["generated_tokens"] = generated
    replay_s = timings.get("replay_s")
    timings["tokens_per_s"] = generated / replay_s if replay_s else None
    directory.write_meta({
        **meta,
        "suite": str(suite.path),
        "suite_name": suite.path.stem,
        "suite_sha256": suite.sha256,
        "suite_warnings": suite.warnings,
        "n_cases": len(suite.cases),
        "reference": reference,
        "thresholds": {"gap_threshold": thresholds.gap_threshold, "gap_window": thresholds.gap_window},
        "gap_noise": tables.gap_noise,
        "flip": flip,
        "traces_digest": traces_digest(traces),  # equal digests: the same bits
        "versions": software_versions(),
        "timings": timings,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": "complete",
        "cases": [
            {"case_id": c.id, "input": c.input, "targets": list(c.targets),
             "checks": [check_label(k) for k in c.checks], "metadata": c.metadata, "line": c.line}
            for c in suite.cases
        ],
    })
    directory.finish()
    return directory.load()
