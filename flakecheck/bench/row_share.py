"""`flakecheck bench row_share`: what the row store saves `run --sample auto` (flakecheck/replay/row_share.py).

The same `--sample auto --sample-only` run of the first demo cases (split-K kernels, SmolLM2, bf16, simulated
replay) twice in one process, the machine's self-check and a short warm-up run done before either is timed:
without the store (every round computes what it needs: rows are shared only inside a round's lockstep) and with
it (a row any earlier round computed is loaded). It reports each side's computed rows, rows shared inside a
lockstep or loaded from the store, wall and replay time, and whether every trace's tokens and logprobs are
bitwise equal.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flakecheck.bench.calibration import DEMO, _cpu
from flakecheck.data.compositions import REFERENCE, Composition
from flakecheck.data.suite import load_suite
from flakecheck.engine import load_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.replay.row_share import DEFAULT_MAX_BYTES, RowStore
from flakecheck.run.engine_source import run_suite

KEY = ["composition", "repeat", "case_id"]
TOKEN_COLUMNS = ["top1_id", "top1_logprob", "top2_id", "top2_logprob", "top1_logit"]


def main(json_out: bool = False, quick: bool = False, limit: int | None = None, seed: int = 1,
         model: str = "smollm2") -> dict[str, Any]:
    loaded = load_model(model, "bfloat16")
    suite = load_suite(DEMO).select(limit=limit or (2 if quick else 4))
    resolve_engine(EngineSettings(model), probe_dims(loaded.config))
    sides: dict[str, dict[str, Any]] = {}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        # a short run first: the first replay in a process pays one-time costs that neither side should carry
        run_suite(suite.select(limit=1), model=loaded, kernels="splitk", compositions=[Composition(REFERENCE)],
                  out=Path(tmp) / "warm", html=False, max_tokens=4)
        for side, rows in (("without_store", 0), ("with_store", DEFAULT_MAX_BYTES)):
            t0 = time.perf_counter()
            with RowStore.capacity(rows):
                run = run_suite(suite, model=loaded, kernels="splitk", compositions=[Composition(REFERENCE)],
                                out=Path(tmp) / side, html=False, sample="auto", sample_seed=seed)
            wall = time.perf_counter() - t0
            stats = run.meta["replay_stats"]
            sides[side] = {"wall_s": round(wall, 2), "replay_s": round(run.meta["timings"]["replay_s"], 2),
                           **{k: stats.get(k) for k in ("rows", "shared_rows", "loaded_rows", "stored_rows",
                                                         "skipped_rows", "forward_passes", "steps")}}
            tokens = run.tokens[[*KEY, "step", *TOKEN_COLUMNS]].sort_values([*KEY, "step"])
            tables[side] = (run.runs[[*KEY, "token_ids"]].sort_values(KEY).reset_index(drop=True),
                            tokens.reset_index(drop=True))
            if not json_out:
                print(f"{side:14s} {wall:8.1f} s  {stats.get('rows')} rows computed", file=sys.stderr, flush=True)
            draws = run.meta["adaptive"]["draws_run"]
    alone, shared = sides["without_store"], sides["with_store"]
    result = {
        "bench": "row_share",
        "model": model,
        "kernels": "splitk",
        "cases": len(suite.cases),
        "seed": seed,
        "draws_run": len(draws),
        "without_store": alone,
        "with_store": shared,
        "rows_saved": (alone["rows"] or 0) - (shared["rows"] or 0),
        "rows_ratio": round(shared["rows"] / alone["rows"], 3) if alone["rows"] else None,
        "wall_ratio": round(shared["wall_s"] / alone["wall_s"], 3),
        "bitwise_equal": _bitwise_equal(tables["without_store"], tables["with_store"]),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu": _cpu(),
    }
    print(json.dumps(result))
    return result


def _bitwise_equal(a: tuple[pd.DataFrame, pd.DataFrame], b: tuple[pd.DataFrame, pd.DataFrame]) -> bool:
    """Every trace's tokens, and every step's top-2 ids, logprobs and logit, bit for bit."""
    (runs_a, tokens_a), (runs_b, tokens_b) = a, b
    if len(runs_a) != len(runs_b) or len(tokens_a) != len(tokens_b):
        return False
    if not runs_a[KEY].equals(runs_b[KEY]) or not tokens_a[[*KEY, "step"]].equals(tokens_b[[*KEY, "step"]]):
        return False
    if any(list(x) != list(y) for x, y in zip(runs_a.token_ids, runs_b.token_ids)):
        return False
    return all(np.asarray(tokens_a[c]).tobytes() == np.asarray(tokens_b[c]).tobytes() for c in TOKEN_COLUMNS)
