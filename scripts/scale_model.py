"""A model, not a measurement: how a large suite's replay would split over many GPUs.

The shard plan is flakecheck's own (flakecheck.replay.shards over the default compositions plus N sampled
ones); the costs are parameters given on the command line, defaulting to an 8B Llama-class model in bf16 on
H100s: a forward pass costs at least the time to read the weights once (memory-bound: weights / bandwidth)
and at least rows x FLOPs-per-row / sustained FLOP rate (compute-bound). Two bounds come out:

- work: every shard's rows at the compute-bound rate, packed as the plan packs them (the largest shard);
- schedule: a batched composition is one unit whose steps follow one another — ceil(cases / batch) rounds
  of its decode, each output-length steps long, every step at least one weight read. A shard cannot finish
  before its longest unit's schedule, whatever it shares its passes with.

Usage: python scripts/scale_model.py [--cases 5000] [--prompt 300] [--output 256] [--draws 32] [--gpus 64]
"""

from __future__ import annotations

import argparse
import json
import math

from flakecheck.analysis.flip.server_load import parse_load, sample_compositions
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS
from flakecheck.replay.requests import CaseRequest
from flakecheck.replay.shards import balance, plan_shards, plan_units


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=5000)
    p.add_argument("--prompt", type=int, default=300, help="prompt tokens a case")
    p.add_argument("--output", type=int, default=256, help="max tokens a case")
    p.add_argument("--draws", type=int, default=32, help="sampled compositions")
    p.add_argument("--load", default="poisson:16")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--params", type=float, default=8.0e9, help="model parameters")
    p.add_argument("--bytes-per-param", type=float, default=2.0)
    p.add_argument("--bandwidth", type=float, default=3.35e12, help="bytes/s (H100 SXM HBM3)")
    p.add_argument("--flops", type=float, default=4.0e14, help="sustained FLOP/s of the split-K twins")
    a = p.parse_args()

    cases = [CaseRequest(f"c{i}", [1] * a.prompt, a.output) for i in range(a.cases)]
    draws = sample_compositions(parse_load(a.load), a.draws, seed=0)
    work = [(c, 0) for c in (*DEFAULT_COMPOSITIONS, *draws)]
    units = plan_units(cases, work)
    shards = plan_shards(units, a.gpus)
    row_s = 2 * a.params / a.flops
    step_s = a.params * a.bytes_per_param / a.bandwidth
    batched = [c for c, _ in work if not c.cases_alone]
    # a batched composition's critical path: its rounds of decode one after another, a weight read a step. A
    # serial one with a prefix cache is one unit too, but its requests run side by side in the lockstep
    # (each waits only for earlier ones sharing its first prompt block): taken here as no shared prefixes.
    longest = max((c for c in batched if c.max_batch > 1), key=lambda c: math.ceil(a.cases / c.max_batch))
    longest_schedule = math.ceil(a.cases / longest.max_batch) * a.output * step_s
    total_rows = sum(u.rows for u in units)
    work_s = max(s.rows for s in shards) * row_s
    print(json.dumps({
        "model": "a model, not a measurement", "cases": a.cases, "compositions": len(work),
        "batched_units": len(batched), "units": len(units), "gpus": a.gpus, "shards": len(shards),
        "predicted_balance": round(balance(shards), 3), "total_rows": total_rows,
        "largest_shard_rows": max(s.rows for s in shards),
        "speedup_bound": round(total_rows / max(s.rows for s in shards), 1),
        "one_gpu_work_h": round(total_rows * row_s / 3600, 2), "largest_shard_work_min": round(work_s / 60, 1),
        "longest_schedule": longest.name, "longest_schedule_min": round(longest_schedule / 60, 1),
        "one_gpu_wall_min_bound": round(max(total_rows * row_s, longest_schedule) / 60, 1),
        "wall_min_bound": round(max(work_s, longest_schedule) / 60, 1),
        "batch_sizes": sorted(c.max_batch for c in draws),
    }))


if __name__ == "__main__":
    main()
