"""The demo's bits on this machine: held to the digest recorded in suites/demo.digest.json, so a machine
that computes other bits is caught and named instead of publishing other numbers; and the same bits at one
thread as at two (the property a Ray actor with fewer threads than the driver relies on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flakecheck
from flakecheck.machine.fingerprint import current

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "suites" / "demo.jsonl"
RECORDED = ROOT / "suites" / "demo.digest.json"


@pytest.mark.slow
def test_the_demo_computes_the_recorded_bits(tmp_path: Path) -> None:
    recorded = json.loads(RECORDED.read_text())
    run = flakecheck.run_suite(DEMO, out=tmp_path / "demo", html=False)
    assert run.meta["config"]["kernels"] == recorded["kernels"] and len(run.cases) == recorded["cases"]
    here = current()
    statuses = run.cases.status.value_counts().to_dict()
    mine = [r for r in recorded["recorded"] if r["bits_class"] == here.bits_class()]
    if not mine:
        pytest.skip(f"no digest recorded for this class of machine ({here.bits_class()}); it computed "
                    f"{run.meta['traces_digest']} with statuses {statuses} on {here.describe()}: record it in "
                    f"{RECORDED.name}")
    assert run.meta["traces_digest"] == mine[0]["traces_digest"], (
        f"this machine computes other bits for the demo than {mine[0]['machine']} of the same class did: "
        f"{here.describe()}; statuses here {statuses}, recorded {mine[0]['statuses']}")


DIGEST = """
import json, sys, flakecheck
run = flakecheck.run_suite(sys.argv[1], out=sys.argv[2], html=False, limit=12, max_tokens=24, kernels=sys.argv[3])
print(json.dumps(run.meta["traces_digest"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_one_thread_computes_the_bits_of_two(tmp_path: Path, kernels: str) -> None:
    digests = {}
    for threads in (1, 2):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, "-c", DIGEST, str(DEMO), str(tmp_path / f"t{threads}"), kernels],
                              env=env, capture_output=True, text=True, cwd=ROOT, timeout=1800, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        digests[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    assert digests[1] == digests[2]
