"""`flakecheck bench run`: a whole run, simulated against physical replay, on the same work.

Both sides are `run_suite` on the first 24 demo cases under the six default compositions (split-K
kernels, SmolLM2, bf16) in one process: `physical` replays each composition alone through one
engine, `simulated` runs every composition at once in shared forward passes. The sides alternate
(simulated, physical, simulated, ...) so load from other processes falls on both; the medians
give `speedup_vs_physical`. `bitwise_equal` says whether every table (token ids, logprobs, top-2,
statuses) came out identical. `overhead` is the simulated run's wall time over its replay time
(what analysis, grading and writing add). Peak memory is the process's maximum resident set.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from flakecheck.data.compositions import DEFAULT_COMPOSITIONS
from flakecheck.data.rundir import RunData
from flakecheck.data.suite import load_suite
from flakecheck.engine import load_model
from flakecheck.run.engine_source import run_suite

DEMO = Path(__file__).resolve().parents[2] / "suites" / "demo.jsonl"


def main(json_out: bool = False, quick: bool = False, cases: int | None = None, repeats: int | None = None,
         model: str = "smollm2", ray: str | None = None, workers: int = 2) -> dict[str, Any]:
    n_cases = cases or (4 if quick else 24)
    n_repeats = repeats or 1
    compositions = list(DEFAULT_COMPOSITIONS[:3] if quick else DEFAULT_COMPOSITIONS)
    loaded = load_model(model, "bfloat16")
    suite = load_suite(DEMO).select(limit=n_cases)
    if quick:  # short answers: a smoke test of the benchmark itself
        suite = replace(suite, cases=[replace(c, max_tokens=min(c.max_tokens or 8, 8)) for c in suite.cases])
    times: dict[str, list[float]] = {"simulated": [], "physical": []}
    runs: dict[str, RunData] = {}
    overheads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n_repeats):
            for mode in ("simulated", "physical"):
                t0 = time.perf_counter()
                run = run_suite(suite, model=loaded, kernels="splitk", compositions=compositions,
                                           out=Path(tmp) / f"{mode}-{i}", html=False, replay=mode)
                times[mode].append(time.perf_counter() - t0)
                runs[mode] = run
                if mode == "simulated":
                    overheads.append(times[mode][-1] / run.meta["timings"]["replay_s"])
                if not json_out:
                    print(f"{mode:9s} {times[mode][-1]:8.1f} s", file=sys.stderr, flush=True)
    simulated_s, physical_s = statistics.median(times["simulated"]), statistics.median(times["physical"])
    result = {
        "bench": "run",
        "model": model,
        "kernels": "splitk",
        "cases": len(suite.cases),
        "compositions": len(compositions),
        "repeats": n_repeats,
        "simulated_s": round(simulated_s, 2),
        "physical_s": round(physical_s, 2),
        "speedup_vs_physical": round(physical_s / simulated_s, 2),
        "bitwise_equal": _same(runs["simulated"], runs["physical"]),
        "overhead": round(statistics.median(overheads), 4),
        "generated_tokens": int(runs["simulated"].runs.n_tokens.sum()),
        "simulation": {k: v for k, v in runs["simulated"].meta["replay_stats"].items() if k != "mode"},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if ray is not None:
        # the simulated side again, in shards on the cluster (its time includes starting the actors and
        # loading the model in each)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            clustered = run_suite(suite, model=model, kernels="splitk", compositions=compositions,
                                             out=Path(tmp) / "ray", html=False, ray=ray, workers=workers)
            ray_s = time.perf_counter() - t0
        stats = clustered.meta["replay_stats"]["cluster"]
        result.update({"ray_workers": workers, "ray_s": round(ray_s, 2),
                       "ray_replay_s": round(clustered.meta["timings"]["replay_s"], 2),
                       "ray_speedup_vs_simulated": round(simulated_s / ray_s, 3),
                       "ray_bitwise_equal": _same(clustered, runs["simulated"]),
                       "ray_shards": stats["shards"], "ray_predicted_balance": stats.get("predicted_balance")})
    print(json.dumps(result))
    return result


def _same(a: RunData, b: RunData) -> bool:
    for table in ("runs", "tokens", "cases"):
        try:
            pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True)
        except AssertionError:
            return False
    return True
