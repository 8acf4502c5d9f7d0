"""The run directory: parquet tables + meta.json, written atomically, read back without the model.

Layout: runs.parquet, tokens.parquet, cases.parquet, meta.json, report.html, and while a run is in
progress or was interrupted, partial/ (fingerprint.json, one trace parquet per finished composition and
repeat, and shards/: one per finished shard of a replay on a Ray cluster). `RunDirectory` is the one place
that knows these names.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from flakecheck.data.record import RunRecord
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError

RUNS_SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("composition", pa.string()),
    ("repeat", pa.int32()),
    ("token_ids", pa.list_(pa.int32())),
    ("text", pa.string()),
    ("finish_reason", pa.string()),
    ("passed", pa.bool_()),
    ("first_divergence", pa.int32()),
    ("n_tokens", pa.int32()),
    # a mixture of experts: the first step whose chosen experts differ from the reference's (null: none, or dense)
    ("routing_divergence", pa.int32()),
])

TOKENS_SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("composition", pa.string()),
    ("repeat", pa.int32()),
    ("step", pa.int32()),
    ("token_id", pa.int32()),
    ("token", pa.string()),
    ("logprob", pa.float32()),
    ("top1_id", pa.int32()),
    ("top1_logprob", pa.float32()),
    ("top2_id", pa.int32()),
    ("top2_logprob", pa.float32()),
    ("gap", pa.float32()),
    ("top2_token", pa.string()),  # the runner-up's text, for reports without a tokenizer
    ("top1_logit", pa.float32()),  # the chosen token's raw logit (null where the source reports none)
    # a mixture of experts (null for a dense model): the smallest k-th minus (k+1)-th router probability over
    # the layers for the row that chose the token, and that layer
    ("routing_margin", pa.float32()),
    ("routing_layer", pa.int32()),
])

CASES_SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("status", pa.string()),
    ("n_compositions", pa.int32()),
    ("n_distinct_outputs", pa.int32()),
    ("first_divergence", pa.int32()),
    ("divergence_composition", pa.string()),
    ("ref_token", pa.string()),
    ("alt_token", pa.string()),
    ("gap_at_divergence", pa.float32()),
    ("flip_kind", pa.string()),  # tie | near_tie | confident at the first divergence (flakecheck.analysis.flip_kind)
    ("min_gap", pa.float32()),
    ("n_near_ties", pa.int32()),
    ("pass_rate", pa.float32()),
    ("verdict_flip", pa.bool_()),
    ("risk", pa.float32()),
    # flip probability (flakecheck.analysis.flip): over the draws (sampled compositions, a probe's load levels) ...
    ("n_draws", pa.int32()),
    ("p_flip", pa.float64()),  # share of draws whose tokens differ from the reference
    ("p_flip_low", pa.float64()),  # its exact (Clopper–Pearson) 95% interval
    ("p_flip_high", pa.float64()),
    ("p_verdict_flip", pa.float64()),  # share of graded draws whose verdict differs from the reference's
    ("p_flip_pred", pa.float64()),  # predicted from the reference's gaps and the run's measured gap shifts
])

# partial/<composition>.r<repeat>.parquet: the traces of one finished (composition, repeat)
TRACE_SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("composition", pa.string()),
    ("repeat", pa.int32()),
    ("token_ids", pa.list_(pa.int32())),
    ("top1_ids", pa.list_(pa.int32())),
    ("top1_logprobs", pa.list_(pa.float64())),
    ("top2_ids", pa.list_(pa.int32())),
    ("top2_logprobs", pa.list_(pa.float64())),
    ("finish_reason", pa.string()),
    ("top1_logits", pa.list_(pa.float64())),
    ("routing_margins", pa.list_(pa.float64())),  # a mixture of experts' routing per step (flakecheck.data.routing)
    ("routing_layers", pa.list_(pa.int32())),
    ("routing_digests", pa.list_(pa.int64())),
])

# attribution.parquet (`flakecheck explain`): one row per (diverged case, mechanism); see flakecheck.explain
ATTRIBUTION_SCHEMA = pa.schema([
    ("case_id", pa.string()),
    ("mechanism", pa.string()),  # matmul_splitk | attention_splitkv | norm_splits | chunked_prefill | ...
    ("kind", pa.string()),  # reduction | scheduling
    ("candidate", pa.bool_()),  # the mechanism is variable in this run (policy, composition) and was replayed
    ("reason", pa.string()),  # why not a candidate (null when it is)
    ("side_a", pa.string()),  # what the pair compares: composition [policy], one side ...
    ("side_b", pa.string()),  # ... and the other
    ("window", pa.int32()),  # tokens compared: the case's first divergence + --steps-after + 1
    ("diverges", pa.bool_()),  # the pair's tokens differ within the window
    ("first_divergence", pa.int32()),  # the pair's first differing step (null: none within the window)
    ("same_step", pa.bool_()),  # ... is the run's recorded first divergence
    ("same_tokens", pa.bool_()),  # ... with the recorded token pair
    ("token_a", pa.string()),
    ("token_b", pa.string()),
    ("reproduces", pa.bool_()),  # this mechanism alone reproduces the divergence (diverges at the same step)
])

# fixes.parquet (`flakecheck explain`): one row per candidate fix, ranked (rank 1 = the cheapest full fix)
FIXES_SCHEMA = pa.schema([
    ("rank", pa.int32()),
    ("fix", pa.string()),  # fixed_matmul | fixed_attention | fixed_all | serial | no_prefix_cache | no_chunked_prefill
    ("label", pa.string()),
    ("changes", pa.list_(pa.string())),  # the compositions (or "kernels: ...") the fix changes; empty: none
    ("replayed", pa.list_(pa.string())),  # the changed compositions that were replayed (others matched a recorded one)
    ("flaky_cases", pa.int32()),  # diverged cases considered
    ("stabilised", pa.int32()),  # ... with identical tokens under every composition once the fix is applied
    ("still_flaky", pa.list_(pa.string())),
    ("full_fix", pa.bool_()),
    ("verdict_flips_before", pa.int32()),
    ("verdict_flips_after", pa.int32()),
    ("cost_factor", pa.float64()),  # measured slowdown of the work the fix touches (1.0: none; null: not measured)
    ("cost", pa.string()),  # what was measured, in words
    ("vllm", pa.string()),  # the corresponding production settings
    ("sglang", pa.string()),
])

STATUSES = ("stable", "fragile", "flaky", "verdict_flaky")
TABLES = {"runs": RUNS_SCHEMA, "tokens": TOKENS_SCHEMA, "cases": CASES_SCHEMA}


@dataclass
class RunData:
    path: Path
    meta: dict[str, Any]
    runs: pd.DataFrame
    tokens: pd.DataFrame
    cases: pd.DataFrame
    # what `flakecheck explain` added (None when it has not run on this directory)
    attribution: pd.DataFrame | None = None
    fixes: pd.DataFrame | None = None
    explain: dict[str, Any] | None = None

    @property
    def record(self) -> RunRecord:
        """meta.json, typed (an older run directory's too)."""
        return RunRecord.of(self.meta, sorted(self.runs["composition"].astype(str).unique()))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run directories are shared as CI artifacts
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_table(path: Path, table: pa.Table) -> None:
    """Parquet through the same temp-file, fsync and rename as every other file of a run."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def to_table(rows: list[dict[str, Any]] | pd.DataFrame, schema: pa.Schema) -> pa.Table:
    if isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, schema=schema, preserve_index=False)
    return pa.Table.from_pylist(rows, schema=schema)


def read_table(path: Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()


class RunDirectory:
    """Every file of a run directory, by name, and how it is written (atomically, never half a file)."""

    RUNS, TOKENS, CASES = "runs.parquet", "tokens.parquet", "cases.parquet"
    META, HTML, PARTIAL, FINGERPRINT = "meta.json", "report.html", "partial", "fingerprint.json"
    ATTRIBUTION, FIXES, EXPLAIN = "attribution.parquet", "fixes.parquet", "explain.json"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def html_path(self) -> Path:
        return self.path / self.HTML

    @property
    def partial_dir(self) -> Path:
        return self.path / self.PARTIAL

    # ------------------------------------------------------------------ while the run is in progress

    def begin(self, fingerprint: dict[str, Any], resume: bool) -> None:
        """A new run: refuse a non-empty directory, record what decides the traces. A resumed run: the
        recorded fingerprint must match, else the saved traces belong to another run."""
        recorded = self.partial_dir / self.FINGERPRINT
        if resume:
            if not recorded.is_file():
                raise UserError(f"{self.path}: nothing to resume (no {self.PARTIAL}/{self.FINGERPRINT})")
            saved = json.loads(recorded.read_text())
            normal = json.loads(json.dumps(fingerprint, default=str))
            changed = sorted(k for k in set(saved) | set(normal) if saved.get(k) != normal.get(k))
            if changed:
                raise UserError(f"{self.path}: cannot resume, the run's settings differ in: {', '.join(changed)}")
            return
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise UserError(f"{self.path}: already exists and is not empty (choose another --out, or --resume)")
        write_json(recorded, fingerprint)

    def _trace_file(self, composition: str, repeat: int) -> Path:
        return self.partial_dir / f"{composition}.r{repeat}.parquet"

    def saved_traces(self, composition: str, repeat: int) -> list[Trace] | None:
        """The traces a previous, interrupted attempt saved for this (composition, repeat), if any."""
        path = self._trace_file(composition, repeat)
        if not path.is_file():
            return None
        return [Trace.from_record(row) for row in pq.read_table(path).to_pylist()]

    def save_traces(self, composition: str, repeat: int, traces: list[Trace]) -> None:
        rows = [vars(t) for t in traces]
        write_table(self._trace_file(composition, repeat), pa.Table.from_pylist(rows, schema=TRACE_SCHEMA))

    def save_shard(self, key: str, traces: list[Trace]) -> None:
        """A finished shard's traces (some of a run's cases under some compositions), under partial/shards/."""
        write_table(self.partial_dir / "shards" / f"{key}.parquet",
                    pa.Table.from_pylist([vars(t) for t in traces], schema=TRACE_SCHEMA))

    def saved_shard_traces(self) -> list[Trace]:
        """Every trace of the shards an interrupted attempt saved."""
        return [Trace.from_record(row) for path in sorted((self.partial_dir / "shards").glob("*.parquet"))
                for row in pq.read_table(path).to_pylist()]

    def n_saved(self, work: list[tuple[str, int]]) -> int:
        return sum(self._trace_file(c, r).is_file() for c, r in work)

    # ---------------------------------------------------------------------------------- the result

    def write_tables(self, runs: list[dict[str, Any]], tokens: list[dict[str, Any]],
                     cases: list[dict[str, Any]]) -> None:
        write_table(self.path / self.RUNS, to_table(runs, RUNS_SCHEMA))
        write_table(self.path / self.TOKENS, to_table(tokens, TOKENS_SCHEMA))
        write_table(self.path / self.CASES, to_table(cases, CASES_SCHEMA))

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_json(self.path / self.META, meta)

    def write_explain(self, attribution: list[dict[str, Any]], fixes: list[dict[str, Any]] | None,
                      info: dict[str, Any]) -> None:
        """What `flakecheck explain` found. The old explain.json is removed first and the new one, naming the tables
        it belongs with, written last: a crash part-way leaves a directory every reader sees as not explained."""
        (self.path / self.EXPLAIN).unlink(missing_ok=True)
        write_table(self.path / self.ATTRIBUTION, to_table(attribution, ATTRIBUTION_SCHEMA))
        if fixes is not None:
            write_table(self.path / self.FIXES, to_table(fixes, FIXES_SCHEMA))
        else:
            (self.path / self.FIXES).unlink(missing_ok=True)
        write_json(self.path / self.EXPLAIN, {**info, "tables": [self.ATTRIBUTION] + ([self.FIXES] if fixes is not None
                                                                                     else [])})

    def finish(self) -> None:
        """The run is complete: its saved traces are no longer needed."""
        shutil.rmtree(self.partial_dir, ignore_errors=True)

    def load(self) -> RunData:
        return load_run(self.path)


def default_run_dir(suite_path: Path) -> Path:
    """reports/<suite stem>-<UTC time>, numbered when a run started in the same second."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path("reports") / f"{suite_path.stem}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def load_run(path: str | Path, explanation: bool = True) -> RunData:
    """The three tables as DataFrames plus meta.json; a clear UserError if the directory is not a run.
    `explanation=False` leaves out what `flakecheck explain` wrote (explain itself reopens a run whose
    explain tables are damaged, to write them again)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a directory (expected a run directory written by `flakecheck run`)")
    names = RunDirectory
    missing = [name for name in (names.META, names.RUNS, names.TOKENS, names.CASES) if not (path / name).is_file()]
    if missing:
        hint = " (an interrupted run: continue it with `flakecheck run ... --out DIR --resume`)" \
            if (path / names.PARTIAL).is_dir() else ""
        raise UserError(f"{path}: not a complete run directory, missing {', '.join(missing)}{hint}")
    try:
        meta = json.loads((path / names.META).read_text())
        tables = {name: read_table(path / f"{name}.parquet") for name in TABLES}
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserError(f"{path}: unreadable run directory ({exc})") from exc
    explained = _explained(path) if explanation else {}
    return RunData(path, meta, tables["runs"], tables["tokens"], tables["cases"], **explained)


def with_explanation(run: RunData) -> RunData:
    """`run` with what `flakecheck explain` wrote into its directory (the tables it already has are kept)."""
    return replace(run, **_explained(run.path))


def _explained(path: Path) -> dict[str, Any]:
    """attribution / fixes / explain from a finished `flakecheck explain` (explain.json lists its tables)."""
    names = RunDirectory
    try:
        info = json.loads((path / names.EXPLAIN).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UserError(f"{path / names.EXPLAIN}: unreadable ({exc}); run `flakecheck explain {path}` again") from exc
    listed = set(info.get("tables") or []) if isinstance(info, dict) else set()
    try:
        return {
            "explain": info,
            "attribution": read_table(path / names.ATTRIBUTION) if names.ATTRIBUTION in listed else None,
            "fixes": read_table(path / names.FIXES) if names.FIXES in listed else None,
        }
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{path}: unreadable explain tables ({exc}); run `flakecheck explain {path}` again") from exc
