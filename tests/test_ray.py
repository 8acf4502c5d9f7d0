"""Replay on a local Ray cluster (loopback only, started and stopped by each run): bitwise the run of one
process, a killed actor's shard rerun elsewhere, Ctrl-C keeping finished shards for a resume without Ray,
an unreachable cluster refused before anything is written, actors on different machines refused."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pandas as pd
import pytest

import flakecheck
from flakecheck.analysis.flip.server_load import parse_load, sample_compositions
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition
from flakecheck.errors import UserError
from flakecheck.replay import cluster as cluster_module
from flakecheck.replay.cluster import check_same_machines
from flakecheck.replay.shards import balance, plan_shards, plan_units
from tests.test_run import write_suite

ray = pytest.importorskip("ray", reason="Ray is installed by `make test` (pip install 'flakecheck[ray]')")

# the six defaults, two compositions sampled from a load model (--sample) and a batch of another size and order
COMPOSITIONS = (*DEFAULT_COMPOSITIONS, *sample_compositions(parse_load("poisson:4"), 2, seed=0),
                Composition("b5-s3", max_batch=5, order_seed=3))


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("suite") / "tiny.jsonl")


def _run(model_dir: Path, suite: Path, out: Path, kernels: str, **options):
    return flakecheck.run_suite(suite, model=str(model_dir), kernels=kernels, max_tokens=8, out=out, html=False,
                                compositions=COMPOSITIONS, **options)


def _same_tables(a, b) -> None:
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True)


@pytest.fixture(scope="module")
def one_process(tiny_wide_model_dir, suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return {k: _run(tiny_wide_model_dir, suite, out / k, k) for k in ("splitk", "invariant")}


@pytest.mark.parametrize("kernels", ["splitk", "invariant"])
def test_a_two_actor_cluster_gives_the_bits_of_one_process(tiny_wide_model_dir, suite, one_process, tmp_path,
                                                           kernels) -> None:
    clustered = _run(tiny_wide_model_dir, suite, tmp_path / "ray", kernels, ray="local", workers=2)
    _same_tables(clustered, one_process[kernels])
    stats = clustered.meta["replay_stats"]["cluster"]
    assert len(stats["workers"]) == 2 and len({w["pid"] for w in stats["workers"]}) == 2
    assert stats["retries"] == 0 and stats["shards"] >= 2 and not stats["mixed_devices"]
    assert not ray.is_initialized(), "the run stops the cluster it started"


def test_explain_on_a_cluster_gives_the_attribution_and_fixes_of_one_process(one_process, tmp_path) -> None:
    """explain's targeted replays (one-class kernel policies, windows, fixes) in shards on two actors: the same
    attribution and the same stabilised cases as explaining in one process."""
    import shutil

    here, there = tmp_path / "here", tmp_path / "there"
    shutil.copytree(one_process["splitk"].path, here)
    shutil.copytree(one_process["splitk"].path, there)
    local = flakecheck.explain_run(here, cost_repeats=1)
    clustered = flakecheck.explain_run(there, cost_repeats=1, ray="local", workers=2)
    assert len(local.attribution) > 0, "the tiny run must have diverged cases to explain"
    pd.testing.assert_frame_equal(clustered.attribution, local.attribution, check_exact=True)
    outcome = ["stabilised", "full_fix", "verdict_flips_after"]  # the rank also weighs timed costs: not compared
    pd.testing.assert_frame_equal(clustered.fixes.set_index("fix").sort_index()[outcome],
                                  local.fixes.set_index("fix").sort_index()[outcome], check_exact=True)
    stats = clustered.explain["replays"]["attribution"]["cluster"]
    assert len(stats["workers"]) == 2 and stats["shards"] >= 2
    assert not ray.is_initialized(), "explain stops the cluster it started"


def test_a_killed_actor_loses_only_its_shard(tiny_wide_model_dir, suite, one_process, tmp_path, monkeypatch) -> None:
    killed: list[int] = []
    run = cluster_module.Cluster.run

    def run_and_kill(self, cases, shards, on_shard, on_case, on_dispatch=None):
        def dispatch(index: int, shard, pid: int) -> None:
            if not killed and shard.index != min(s.index for s in shards):  # a shard in flight, not the first
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        return run(self, cases, shards, on_shard, on_case, dispatch)

    monkeypatch.setattr(cluster_module.Cluster, "run", run_and_kill)
    clustered = _run(tiny_wide_model_dir, suite, tmp_path / "ray", "splitk", ray="local", workers=2)
    assert killed, "the test must have killed an actor"
    stats = clustered.meta["replay_stats"]["cluster"]
    assert stats["retries"] >= 1 and stats["lost_workers"] == 1
    _same_tables(clustered, one_process["splitk"])


def test_ctrl_c_keeps_finished_shards_and_resume_works_without_ray(tiny_wide_model_dir, suite, one_process, tmp_path,
                                                                   monkeypatch) -> None:
    run = cluster_module.Cluster.run

    def interrupted(self, cases, shards, on_shard, on_case, on_dispatch=None):
        finished = []

        def keep(shard, traces):
            on_shard(shard, traces)
            finished.append(shard)
            if len(finished) == 2:
                raise KeyboardInterrupt

        return run(self, cases, shards, keep, on_case, on_dispatch)

    monkeypatch.setattr(cluster_module.Cluster, "run", interrupted)
    out = tmp_path / "ray"
    with pytest.raises(flakecheck.api.RunInterrupted) as stop:
        _run(tiny_wide_model_dir, suite, out, "splitk", ray="local", workers=2)
    assert "finished shards" in str(stop.value) and "--resume" in str(stop.value)
    assert len(list((out / "partial" / "shards").glob("*.parquet"))) == 2
    assert not ray.is_initialized()
    monkeypatch.undo()
    resumed = _run(tiny_wide_model_dir, suite, out, "splitk", resume=True)  # no Ray this time
    _same_tables(resumed, one_process["splitk"])


def test_an_unreachable_cluster_is_refused_before_anything_is_written(tiny_wide_model_dir, suite, tmp_path) -> None:
    with pytest.raises(UserError) as refused:
        _run(tiny_wide_model_dir, suite, tmp_path / "ray", "splitk", ray="127.0.0.1:1")
    assert refused.value.exit_code == 2 and "cannot reach the Ray cluster" in str(refused.value)
    assert not (tmp_path / "ray").exists()


def test_actors_on_different_machines_are_refused_unless_allowed() -> None:
    a = {"host": "a", "pid": 1, "machine": {"cpu": "AMD EPYC", "isa": ["avx2"]}, "machine_summary": "AMD",
         "paths": {"fbgemm": "padded"}}
    b = {**a, "host": "b", "pid": 2, "machine": {"cpu": "Intel Xeon", "isa": ["avx2", "avx512f"]},
         "machine_summary": "Intel"}
    assert check_same_machines([a, {**a, "pid": 3}], allow=False) is False
    with pytest.raises(UserError) as refused:
        check_same_machines([a, b], allow=False)
    assert "AMD" in str(refused.value) and "Intel" in str(refused.value)
    assert check_same_machines([a, b], allow=True) is True  # mixed, recorded


def test_shards_cover_the_work_once_and_balance_by_rows() -> None:
    from flakecheck.replay.requests import CaseRequest

    cases = [CaseRequest(f"c{i}", list(range(10 + 7 * i)), 16) for i in range(12)]
    work = [(c, r) for r in range(2) for c in COMPOSITIONS]
    units = plan_units(cases, work)
    shards = plan_shards(units, 8)
    reported = [(j.name, j.repeat, c) for s in shards for j in s.jobs for c in j.cases]
    assert len(reported) == len(set(reported)) == len(work) * len(cases)  # every trace exactly once
    serial = [u for u in units if all(j.composition.cases_alone for j in u.jobs)]
    assert len(serial) == len(cases), "a serial case is one unit under every serial composition and repeat"
    assert sum(s.rows for s in shards) == sum(u.rows for u in units)
    # greedy onto the lightest: no shard exceeds the mean by more than one unit (LPT's bound)
    mean = sum(u.rows for u in units) / len(shards)
    assert max(s.rows for s in shards) <= mean + max(u.rows for u in units)
    assert balance(shards) == max(s.rows for s in shards) / mean
