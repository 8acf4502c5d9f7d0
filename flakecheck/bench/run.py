"""`flakecheck bench run`: the cost of everything `run` adds on top of generating.

Both sides do the same engine work in the same process: `generation` replays the demo cases
under the default compositions through a fresh engine and keeps the completions; `run` is
`run_suite` on the same cases (replay + analysis + grading + parquet + meta + HTML).
The two alternate, and the medians are compared: overhead = median(run) / median(generation).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from flakecheck.compositions import DEFAULT_COMPOSITIONS
from flakecheck.engine import LLMEngine, encode_prompt, load_model
from flakecheck.kernels import get_ops
from flakecheck.replay import CaseRequest, replay
from flakecheck.suite import load_suite

DEMO = Path(__file__).resolve().parents[2] / "suites" / "demo.jsonl"


def main(json_out: bool = False, quick: bool = False) -> None:
    n_cases, repeats = (4, 1) if quick else (32, 2)
    compositions = list(DEFAULT_COMPOSITIONS[:2] if quick else DEFAULT_COMPOSITIONS)
    max_tokens = 8 if quick else 64
    model = load_model("smollm2", "bfloat16")
    suite = load_suite(DEMO).select(limit=n_cases)
    if quick:  # short answers: a smoke test of the benchmark itself
        suite = replace(suite, cases=[replace(c, max_tokens=min(c.max_tokens or max_tokens, max_tokens))
                                      for c in suite.cases])
    requests = [CaseRequest(c.id, encode_prompt(model, c.input), c.max_tokens or max_tokens) for c in suite.cases]

    def generation() -> float:
        t0 = time.perf_counter()
        engine = LLMEngine(model, get_ops("splitk"))
        for composition in compositions:
            replay(engine, requests, composition, 0)
        return time.perf_counter() - t0

    def full_run() -> float:
        import flakecheck

        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            flakecheck.run_suite(suite, model=model, kernels="splitk", compositions=compositions,
                                 max_tokens=max_tokens, out=Path(tmp) / "run")
            return time.perf_counter() - t0

    gen_s, run_s = [], []
    for _ in range(repeats):
        gen_s.append(generation())
        run_s.append(full_run())
    result = {
        "bench": "run",
        "cases": len(requests),
        "compositions": len(compositions),
        "generation_s": round(statistics.median(gen_s), 3),
        "run_s": round(statistics.median(run_s), 3),
        "overhead": round(statistics.median(run_s) / statistics.median(gen_s), 4),
        "repeats": repeats,
    }
    if not json_out:
        print(f"generation {gen_s}  run {run_s}")
    print(json.dumps(result))
