"""`flakecheck bench pinning`: what the pinned reproducibility settings cost on this machine.

The libraries read the settings once, when they start, so the two sides run in child processes:
`bench kernels` (every policy's decode step at batch 1, 16, 64) and `bench run` (simulated replay of demo
cases under the six default compositions), each pinned and with FLAKECHECK_PIN=0, alternating (pinned,
unpinned, pinned, ...) so load from other processes falls on both. The JSON line gives the medians and
pinned / unpinned ratios (above 1: pinning costs that much).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from flakecheck.machine.pinning import PINS


def main(json_out: bool = False, quick: bool = False, cases: int | None = None, repeats: int | None = None) -> None:
    rounds = repeats or (1 if quick else 3)
    kernels_args = ["kernels", "--json"] + (["--quick"] if quick else [])
    run_args = ["run", "--json", "--cases", str(cases or (4 if quick else 12))] + (["--quick"] if quick else [])
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {"kernels": {"pinned": [], "unpinned": []},
                                                           "run": {"pinned": [], "unpinned": []}}
    for i in range(rounds):
        for bench, args in (("kernels", kernels_args), ("run", run_args)):
            for side in ("pinned", "unpinned"):
                result = _child(args, pinned=side == "pinned")
                samples[bench][side].append(result)
                if not json_out:
                    print(f"round {i + 1}/{rounds} {bench:7s} {side:8s} done", file=sys.stderr, flush=True)
    decode = {}
    for batch in samples["kernels"]["pinned"][0]["median_ms"]:
        for policy in ("native", "invariant", "splitk"):
            med = {side: statistics.median(s["median_ms"][batch]["decode_step"][policy]
                                           for s in samples["kernels"][side]) for side in ("pinned", "unpinned")}
            decode[f"{batch}_{policy}"] = {**{k: round(v, 3) for k, v in med.items()},
                                           "ratio": round(med["pinned"] / med["unpinned"], 3)}
    run = {side: statistics.median(s["simulated_s"] for s in samples["run"][side]) for side in ("pinned", "unpinned")}
    summary = {
        "bench": "pinning",
        "pins": dict(PINS),
        "rounds": rounds,
        "machine": samples["kernels"]["pinned"][0].get("machine"),
        "decode_step_ms": decode,
        "run_simulated_s": {**{k: round(v, 2) for k, v in run.items()},
                            "ratio": round(run["pinned"] / run["unpinned"], 3)},
        "run_cases": samples["run"]["pinned"][0]["cases"],
    }
    print(json.dumps(summary))


def _child(args: list[str], pinned: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in PINS}
    env["FLAKECHECK_PIN"] = "1" if pinned else "0"
    done = subprocess.run([sys.executable, "-m", "flakecheck", "bench", *args], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
