"""`flakecheck bench scale`: the same run in one process and on a local Ray cluster of 1 and 2 actors.

On the demo's first cases (24 by default) under the six default compositions, split-K, SmolLM2: wall time
of each (the cluster's include starting it and loading the model in every actor), whether every table is
bitwise the one-process run's, the shard plan's predicted balance (the largest shard's rows over the mean),
and the rows computed in one process against the sum over shards (rows that are one computation in two
shards are computed twice). `--suite FILE` times that suite in one process only (the 1,000-case suite:
`suites/large.jsonl`). A machine with 2 cores should expect no speedup from 2 actors: they share them.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flakecheck.bench.run import DEMO, _same
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS
from flakecheck.data.suite import load_suite
from flakecheck.engine import load_model
from flakecheck.run.engine_source import run_suite


def main(json_out: bool = False, quick: bool = False, cases: int | None = None, suite: str | None = None,
         workers: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    if suite is not None:
        return _suite_alone(Path(suite), json_out, cases)
    n_cases = cases or (4 if quick else 24)
    loaded = load_model("smollm2", "bfloat16")
    selected = load_suite(DEMO).select(limit=n_cases)
    result: dict[str, Any] = {"bench": "scale", "model": "smollm2", "kernels": "splitk", "cases": n_cases,
                              "compositions": len(DEFAULT_COMPOSITIONS)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        one = run_suite(selected, model=loaded, kernels="splitk", out=Path(tmp) / "one", html=False,
                                   max_tokens=16 if quick else 64)
        result["one_process_s"] = round(time.perf_counter() - t0, 2)
        result["one_process_rows"] = one.meta["replay_stats"]["rows"]
        _say(json_out, f"one process {result['one_process_s']} s")
        for n in workers:
            t0 = time.perf_counter()
            run = run_suite(selected, model="smollm2", kernels="splitk", out=Path(tmp) / f"ray{n}",
                                       html=False, ray="local", workers=n, max_tokens=16 if quick else 64)
            stats = run.meta["replay_stats"]["cluster"]
            result[f"ray_{n}_s"] = round(time.perf_counter() - t0, 2)
            result[f"ray_{n}_replay_s"] = round(run.meta["timings"]["replay_s"], 2)
            result[f"ray_{n}_bitwise_equal"] = _same(run, one)
            result[f"ray_{n}_rows"] = stats["computed_rows"]
            result[f"ray_{n}_shards"] = stats["shards"]
            result[f"ray_{n}_predicted_balance"] = run.meta["replay_stats"]["cluster"].get("predicted_balance")
            _say(json_out, f"{n} actor(s) {result[f'ray_{n}_s']} s")
    last = workers[-1]
    result["speedup"] = round(result["one_process_s"] / result[f"ray_{last}_s"], 3)
    result["rows_computed_twice"] = round(result[f"ray_{last}_rows"] / result["one_process_rows"] - 1, 3)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result))
    return result


def _suite_alone(path: Path, json_out: bool, cases: int | None) -> dict[str, Any]:
    suite = load_suite(path).select(limit=cases)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run = run_suite(suite, kernels="splitk", out=Path(tmp) / "run", html=False, progress=not json_out)
        seconds = time.perf_counter() - t0
    stats = run.meta["replay_stats"]
    counts = run.cases.status.value_counts().to_dict()
    result = {
        "bench": "scale", "suite": str(path), "cases": len(suite.cases), "compositions": len(DEFAULT_COMPOSITIONS),
        "one_process_s": round(seconds, 1), "replay_s": round(run.meta["timings"]["replay_s"], 1),
        "rows": stats.get("rows"), "generated_tokens": int(run.runs.n_tokens.sum()), "statuses": counts,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result))
    return result


def _say(json_out: bool, text: str) -> None:
    if not json_out:
        print(text, file=sys.stderr, flush=True)
