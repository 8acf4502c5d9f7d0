"""The run directory: parquet tables + meta.json, written atomically, read back without the model.

Layout (DESIGN §8): runs.parquet, tokens.parquet, cases.parquet, meta.json, report.html, and
while a run is in progress or was interrupted, partial/ (one parquet per finished composition).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

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
    ("top2_token", pa.string()),  # beyond DESIGN §8: the runner-up's text, for reports without a tokenizer
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
    ("min_gap", pa.float32()),
    ("n_near_ties", pa.int32()),
    ("pass_rate", pa.float32()),
    ("verdict_flip", pa.bool_()),
    ("risk", pa.float32()),
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


def load_run(path: str | Path) -> RunData:
    """The three tables as DataFrames plus meta.json; a clear UserError if the directory is not a run."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a directory (expected a run directory written by `flakecheck run`)")
    missing = [name for name in ("meta.json", "runs.parquet", "tokens.parquet", "cases.parquet")
               if not (path / name).is_file()]
    if missing:
        hint = " (an interrupted run: continue it with `flakecheck run ... --out DIR --resume`)" \
            if (path / "partial").is_dir() else ""
        raise UserError(f"{path}: not a complete run directory, missing {', '.join(missing)}{hint}")
    try:
        meta = json.loads((path / "meta.json").read_text())
        tables = {name: read_table(path / f"{name}.parquet") for name in TABLES}
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserError(f"{path}: unreadable run directory ({exc})") from exc
    return RunData(path, meta, tables["runs"], tables["tokens"], tables["cases"])
