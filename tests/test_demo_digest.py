"""The demo's bits on this machine: held to a digest recorded in suites/demo.digest.json, so a machine that
computes other bits is caught and named instead of publishing other numbers; and the same bits at one thread as
at two (the property a Ray actor with fewer threads than the driver relies on).

A class of machine is held to the digest of the demo's slice (its first 12 cases at 24 tokens, the run the
thread test computes anyway) where one is recorded for it, else to the full demo's: the full demo is 27 minutes
of one core on an AVX2 CPU, whose bf16 matmuls are emulated, and a slice computed with other bits already
shows them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import flakecheck
from flakecheck.machine.fingerprint import current

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "suites" / "demo.jsonl"
RECORDED = ROOT / "suites" / "demo.digest.json"

DIGEST = """
import json, sys, flakecheck
run = flakecheck.run_suite(sys.argv[1], out=sys.argv[2], html=False, limit=int(sys.argv[4]),
                           max_tokens=int(sys.argv[5]), kernels=sys.argv[3])
print(json.dumps({"digest": run.meta["traces_digest"], "statuses": run.cases.status.value_counts().to_dict()}))
"""

Slice = Callable[[str], dict[int, dict]]


@pytest.fixture(scope="module")
def demo_slice(tmp_path_factory: pytest.TempPathFactory) -> Slice:
    """demo_slice(kernels) -> {threads: {"digest", "statuses"}} for the recorded slice, at 1 and 2 threads (each
    its own process: the thread count is read when torch loads); computed once a module."""
    spec = json.loads(RECORDED.read_text())["slice"]
    done: dict[str, dict[int, dict]] = {}

    def run(kernels: str) -> dict[int, dict]:
        if kernels not in done:
            done[kernels] = {}
            for threads in (1, 2):
                out = tmp_path_factory.mktemp(f"{kernels}-t{threads}")
                env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
                proc = subprocess.run([sys.executable, "-c", DIGEST, str(DEMO), str(out), kernels,
                                       str(spec["limit"]), str(spec["max_tokens"])],
                                      env=env, capture_output=True, text=True, cwd=ROOT, timeout=1800, check=False)
                assert proc.returncode == 0, proc.stderr[-2000:]
                done[kernels][threads] = json.loads(proc.stdout.strip().splitlines()[-1])
        return done[kernels]

    return run


def _mine(records: list[dict]) -> dict | None:
    here = current().bits_class()
    return next((r for r in records if r["bits_class"] == here), None)


@pytest.mark.slow
def test_the_demo_computes_the_recorded_bits(demo_slice: Slice, tmp_path: Path) -> None:
    recorded = json.loads(RECORDED.read_text())
    here = current()
    sliced = _mine(recorded["slice"]["recorded"])
    if sliced is not None:
        computed = demo_slice(recorded["slice"]["kernels"])[2]
        assert computed["digest"] == sliced["traces_digest"], (
            f"this machine computes other bits for the demo's slice than {sliced['machine']} of the same class "
            f"did: {here.describe()}; statuses here {computed['statuses']}, recorded {sliced['statuses']}")
        return
    full = _mine(recorded["recorded"])
    run = flakecheck.run_suite(DEMO, out=tmp_path / "demo", html=False)
    assert run.meta["config"]["kernels"] == recorded["kernels"] and len(run.cases) == recorded["cases"]
    statuses = run.cases.status.value_counts().to_dict()
    if full is None:
        pytest.skip(f"no digest recorded for this class of machine ({here.bits_class()}); it computed "
                    f"{run.meta['traces_digest']} with statuses {statuses} on {here.describe()}, and for the slice "
                    f"{demo_slice(recorded['slice']['kernels'])[2]}: record them in {RECORDED.name}")
    assert run.meta["traces_digest"] == full["traces_digest"], (
        f"this machine computes other bits for the demo than {full['machine']} of the same class did: "
        f"{here.describe()}; statuses here {statuses}, recorded {full['statuses']}")


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_one_thread_computes_the_bits_of_two(demo_slice: Slice, kernels: str) -> None:
    digests = demo_slice(kernels)
    assert digests[1]["digest"] == digests[2]["digest"]
