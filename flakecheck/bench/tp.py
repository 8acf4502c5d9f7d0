"""`flakecheck bench tp`: what a change of tensor-parallel size does to the demo, beside a change of batch size,
and what the tp-invariant order costs.

Flips: the first N demo cases (default 24; SmolLM2, bf16) under four compositions — `solo` (TP 1, serial),
`batch8` (TP 1, 8 sequences a step), `tp3` (TP 3, serial: SmolLM2's 9 query heads and 3 KV heads allow 1, 3
and 9) and `tp3-batch8` — once per kernel policy: `splitk`, `invariant`, `tp-invariant`. Per policy, the
share of cases whose tokens differ from solo's under batch8 (the batch size alone), under tp3 (the TP size
alone), and under tp3-batch8 against tp3 (the batch size at TP 3).

Cost: one decode step of SmolLM2 at batch 1, 8 and 32 under each policy, the policies taking turns in one
process (medians of `repeats` turns: the machine is shared, so only the ratios side by side mean anything).
On a CPU the tp-invariant order is a split-K GEMM over 64-wide K blocks in fp32 where the fixed order runs
FBGEMM's fp16 GEMM; on a GPU its cost is different (the fp32 block partials an all-reduce must carry).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from statistics import geometric_mean
from typing import Any

from flakecheck.bench.kernels import engine_step, interleaved
from flakecheck.bench.run import DEMO
from flakecheck.data.compositions import Composition
from flakecheck.data.suite import load_suite
from flakecheck.engine import build_model, load_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels.policy import UNIFORM_POLICIES
from flakecheck.run.engine_source import run_suite

COMPOSITIONS = (Composition("solo"), Composition("batch8", max_batch=8), Composition("tp3", tp=3),
                Composition("tp3-batch8", tp=3, max_batch=8))
POLICIES = ("splitk", "invariant", "tp-invariant")
BATCHES = (1, 8, 32)


def main(json_out: bool = False, quick: bool = False, cases: int | None = None, repeats: int | None = None,
         model: str = "smollm2") -> dict[str, Any]:
    n_cases = cases or (4 if quick else 24)
    loaded = load_model(model, "bfloat16")
    suite = load_suite(DEMO).select(limit=n_cases)
    flips: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kernels in POLICIES:
            run = run_suite(suite, model=loaded, kernels=kernels, compositions=list(COMPOSITIONS),
                            out=Path(tmp) / kernels, html=False, max_tokens=8 if quick else 64)
            tokens = {(str(c), str(n)): list(t) for c, n, t in zip(run.runs.case_id, run.runs.composition,
                                                                   run.runs.token_ids)}
            ids = sorted({c for c, _ in tokens})

            def differ(a: str, b: str) -> list[str]:
                return [c for c in ids if tokens[(c, a)] != tokens[(c, b)]]  # noqa: B023 (used at once)

            pairs = {"batch_size": differ("solo", "batch8"), "tp_size": differ("solo", "tp3"),
                     "batch_size_at_tp3": differ("tp3", "tp3-batch8")}
            flips[kernels] = {**{f"{k}_share": round(len(v) / len(ids), 4) for k, v in pairs.items()},
                              **{f"{k}_cases": v for k, v in pairs.items()},
                              "replay_s": round(run.meta["timings"]["replay_s"], 1)}
            if not json_out:
                print(f"{kernels:13s} {json.dumps({k: v for k, v in flips[kernels].items() if 'share' in k})}",
                      file=sys.stderr, flush=True)
    result = {"bench": "tp", "model": model, "cases": n_cases, "compositions": [c.to_spec() for c in COMPOSITIONS],
              "flips": flips, "decode_step": _cost(loaded, repeats or (3 if quick else 15))}
    print(json.dumps(result))
    return result


def _cost(loaded: Any, repeats: int) -> dict[str, Any]:
    """Decode-step seconds per policy and batch, and each policy's time over the fixed order's."""
    policies = {name: UNIFORM_POLICIES[name] for name in POLICIES}
    others = tuple(p for name, p in policies.items() if name != "invariant")
    spec = resolve_engine(EngineSettings.parse(kernels="invariant"), probe_dims(loaded.config), also=others)
    network = build_model(loaded, spec.ops(also_plans=others))
    steps = {}
    for batch in BATCHES:
        steps[batch] = interleaved({name: engine_step(network, loaded, batch, policy=policy)
                                    for name, policy in policies.items()}, repeats)
    return {
        "batches": list(BATCHES), "repeats": repeats,
        "ms": {name: [round(steps[b][name] * 1e3, 2) for b in BATCHES] for name in POLICIES},
        "vs_invariant": {name: round(geometric_mean([steps[b][name] / steps[b]["invariant"] for b in BATCHES]), 3)
                         for name in POLICIES},
    }
