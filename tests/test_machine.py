"""The machine's promises: reproducibility settings pinned before torch loads, the self-check catching a
kernel whose rows depend on the batch (a fault injected as MKL's GEMM behaved on an AVX-512 Xeon), the
fallback paths invariant by construction, and the self-check holding under every ISA setting and thread
count this CPU supports (in subprocesses: the libraries read those settings once, at their first call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flakecheck
from flakecheck.engine import LoadedModel, load_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import EngineSpec, resolve_engine
from flakecheck.errors import UserError
from flakecheck.kernels.paths import CHOICES, KernelPaths
from flakecheck.kernels.policy import parse_policy
from flakecheck.kernels.registry import get_ops
from flakecheck.machine import invariance_probes as probes
from flakecheck.machine.invariance_probes import ProbeDims
from flakecheck.machine.pinning import PINS, cpu_flags
from flakecheck.machine.selfcheck import verify
from tests.test_run import write_suite

ROOT = Path(__file__).resolve().parents[1]
HAS_AVX2 = "avx2" in cpu_flags()
# every fixed-order matmul path made to fail: nothing is left for the invariant policy
NO_FIXED_MATMUL = ",".join(["fbgemm:padded"] + [f"fixed_matmul:{p}" for p in CHOICES["fixed_matmul"]])
NO_SPLIT_MATMUL = ",".join(f"split_matmul:{p}" for p in CHOICES["split_matmul"])
# SmolLM2's widths with fewer and narrower projections: the libraries' code paths, at a tenth of the cost
MEDIUM = ProbeDims(projections=((960, 576), (576, 1536)), lm_head=(4096, 576), heads=9, kv_heads=3, head_dim=64,
                   norm_widths=(576,))


def _clean_env(**setting: str) -> dict[str, str]:
    """This environment without the pinned settings (this process pinned them), plus `setting`."""
    kept = {k: v for k, v in os.environ.items() if k not in (*PINS, "FLAKECHECK_PIN", "FLAKECHECK_FAULT")}
    return {**kept, **setting}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=_clean_env(**env), capture_output=True, text=True,
                          cwd=ROOT, timeout=900, check=False)


FINGERPRINT = ("import json, flakecheck, torch; from flakecheck.machine.fingerprint import current; "
               "torch.ones(2, 2) @ torch.ones(2, 2); print(json.dumps(current().to_dict()))")


@pytest.mark.skipif(not HAS_AVX2, reason="pinning applies to x86-64 CPUs with AVX2")
def test_pinned_settings_are_in_force_once_flakecheck_is_imported() -> None:
    pinned = json.loads(_python(FINGERPRINT, {}).stdout)
    # read back from the libraries, not from the environment: MKL strict CNR, FBGEMM on its AVX2 kernels
    assert pinned["mkl_cbwr"].endswith(",STRICT")
    assert pinned["fbgemm_isa"] == "AVX2"
    user = json.loads(_python(FINGERPRINT, {"MKL_CBWR": "COMPATIBLE"}).stdout)
    assert user["mkl_cbwr"] == "COMPATIBLE", "a value the user set wins"
    off = json.loads(_python(FINGERPRINT, {"FLAKECHECK_PIN": "0"}).stdout)
    assert not off["mkl_cbwr"].endswith("STRICT") and off["fbgemm_isa"] is None


# ------------------------------------------------------------------------------------ injected faults


@pytest.fixture(scope="module")
def tiny(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_suite(tmp_path_factory.mktemp("suite") / "tiny.jsonl")


def _run(tiny: LoadedModel, suite: Path, out: Path, kernels: str, **options):
    return flakecheck.run_suite(suite, model=tiny, kernels=kernels, max_tokens=8, out=out, html=False, limit=6,
                                **options)


def test_a_failing_fast_path_falls_back_and_the_invariant_promise_still_holds(tiny, suite, tmp_path,
                                                                              monkeypatch) -> None:
    monkeypatch.setenv("FLAKECHECK_FAULT", "fbgemm:padded")
    run = _run(tiny, suite, tmp_path / "inv", "invariant")
    spec = EngineSpec.from_dict(run.meta["engine"])
    assert spec.paths.fbgemm == "off", "the self-check must reject the faulty FBGEMM path"
    assert not spec.verification.refused and "fbgemm" in spec.verification.summary()
    per_step = run.tokens.groupby(["case_id", "step"])
    assert (per_step.top1_logprob.nunique() == 1).all() and (per_step.top2_logprob.nunique() == 1).all()


def test_invariant_is_refused_when_no_fixed_order_matmul_is_invariant(tiny, suite, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLAKECHECK_FAULT", NO_FIXED_MATMUL)
    with pytest.raises(UserError) as refused:
        _run(tiny, suite, tmp_path / "inv", "invariant")
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert "fixed_matmul" in message and "differs by up to" in message and "machine:" in message
    assert not (tmp_path / "inv").exists(), "a refused run writes nothing"
    # the other policies do not rely on fixed-order matmuls and still run
    assert _run(tiny, suite, tmp_path / "sk", "splitk").meta["replay"] == "simulated"


def test_simulated_replay_falls_back_to_physical_when_rows_depend_on_the_batch(tiny, suite, tmp_path,
                                                                               monkeypatch) -> None:
    monkeypatch.setenv("FLAKECHECK_FAULT", NO_SPLIT_MATMUL)
    run = _run(tiny, suite, tmp_path / "sk", "splitk")
    assert run.meta["replay"] == "physical"
    assert "split_matmul" in run.meta["replay_stats"]["fallback"]
    assert "split_matmul" in EngineSpec.from_dict(run.meta["engine"]).verification.failed


def test_the_fault_really_breaks_simulated_replay(tiny) -> None:
    """The injected fault is a real failure of the property, not a flag: the rows of a batch differ from the
    rows alone (what made simulated replay differ from physical replay on the Xeon)."""
    dims = probe_dims(tiny.config)
    os.environ["FLAKECHECK_FAULT"] = "split_matmul:batched"
    try:
        ops = get_ops(parse_policy("splitk"), "torch")
    finally:
        del os.environ["FLAKECHECK_FAULT"]
    n, k = dims.projections[0]
    gen = torch.Generator().manual_seed(1)
    weights = ops.prepare_linear(probes.packable_weight(gen, n, k, torch.bfloat16))
    x = probes.random(gen, probes.BLOCK_ROWS, k, dtype=torch.bfloat16)
    assert probes.linear_rows(ops, weights, 2, x) > 0
    assert probes.linear_rows(get_ops(parse_policy("splitk"), "torch"), weights, 2, x) == 0


def test_kernels_check_reports_the_failure_and_exits_1(monkeypatch, capsys) -> None:
    from flakecheck.machine.kernels_check import check_command

    monkeypatch.setenv("FLAKECHECK_FAULT", NO_FIXED_MATMUL)
    monkeypatch.setattr("flakecheck.machine.kernels_check.SMOLLM2", MEDIUM)
    assert check_command(json_out=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["selfcheck"]["invariant"]["invariant_failed"] == ["fixed_matmul"]
    failed = [r for r in report["results"] if r["policy"] == "invariant" and not r["invariant"]]
    assert [(r["op"], r["check"]) for r in failed] == [("matmul", "rows")]
    assert report["machine"]["cpu"] and report["machine_summary"]


# ---------------------------------------------------------------------------- fallbacks by construction


FALLBACKS = [KernelPaths(fbgemm="off", fixed_matmul=p) for p in CHOICES["fixed_matmul"][1:]] + \
            [KernelPaths(split_matmul=p) for p in CHOICES["split_matmul"][1:]] + \
            [KernelPaths(attention="tiled"), KernelPaths(norm="lanes", softmax="lanes")]


@pytest.mark.parametrize("paths", FALLBACKS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.fallbacks().items()))
@pytest.mark.parametrize("policy", ["invariant", "splitk"])
def test_every_fallback_path_passes_the_self_check_probes(policy: str, paths: KernelPaths) -> None:
    ops = get_ops(parse_policy(policy), "torch", paths=paths)
    dims, gen = MEDIUM, torch.Generator().manual_seed(3)
    for name in paths.fallbacks():
        if name in ("fixed_matmul", "split_matmul"):
            n, k = dims.projections[1]
            weights = ops.prepare_linear(probes.packable_weight(gen, n, k, torch.bfloat16))
            x = probes.random(gen, probes.BLOCK_ROWS, k, dtype=torch.bfloat16)
            orders = [0] if policy == "invariant" else [1, 3, 7]
            assert all(probes.linear_rows(ops, weights, order, x) == 0 for order in orders)
        elif name == "attention":
            kv = probes.KVCacheProbe.make(gen, dims, torch.bfloat16)
            split = 256 if policy == "invariant" else 192
            assert probes.attention_rows(ops, kv, split) == 0
            assert probes.attention_chunking(ops, kv, split) == 0
            assert probes.attention_decode_vs_prefill(ops, kv, split) == 0
        else:
            x = probes.random(gen, probes.BLOCK_ROWS, 4096, dtype=torch.bfloat16, scale=4.0)
            orders = [0] if policy == "invariant" else [1, 2, 4]
            assert all(probes.log_softmax_rows(ops, order, x) == 0 for order in orders)
            w = probes.random(gen, 576, dtype=torch.bfloat16, scale=0.1) + 1
            assert all(probes.rmsnorm_rows(ops, w, order, x[:, :576]) == 0 for order in orders)


@pytest.mark.parametrize("paths", FALLBACKS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.fallbacks().items()))
def test_fallback_paths_compute_the_same_math(paths: KernelPaths) -> None:
    """Slower, not wrong: each fallback is within float32 rounding of a float64 reference."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(37, 576, generator=gen)
    w = torch.randn(960, 576, generator=gen) * 576**-0.5
    exact = (x.double() @ w.double().t())
    for policy, order in (("invariant", 0), ("splitk", 3)):
        ops = get_ops(parse_policy(policy), "torch", paths=paths)
        got = ops.linear(x, ops.prepare_linear(w), groups=((order, slice(None)),)).double()
        assert (got - exact).abs().max() < 1e-4
    logits = torch.randn(5, 3000, generator=gen) * 4
    for order in (0, 2):
        got = get_ops(parse_policy("splitk"), "torch", paths=paths).log_softmax(logits, groups=((order, slice(None)),))
        assert (got.double() - torch.log_softmax(logits.double(), -1)).abs().max() < 1e-4


# ------------------------------------------------------------------- every ISA setting and thread count


def _settings() -> list[dict[str, str]]:
    """The ISA settings this CPU supports that change a code path: pinning off, ATen's generic code (and its
    AVX2 code on a CPU whose best is AVX-512), MKL limited to SSE4.2 (and to AVX2 on an AVX-512 CPU)."""
    flags = cpu_flags()
    settings = [{}, {"FLAKECHECK_PIN": "0"}, {"ATEN_CPU_CAPABILITY": "default"}, {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}]
    if "avx512f" in flags:
        settings += [{"ATEN_CPU_CAPABILITY": "avx2"}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}]
    return settings


SELFCHECK = """
import json, sys, torch, flakecheck
from flakecheck.kernels.policy import parse_policy
from flakecheck.machine.selfcheck import verify
from flakecheck.machine.invariance_probes import ProbeDims
dims = ProbeDims(**json.loads(sys.argv[1]))
out = {}
for policy in ("invariant", "splitk"):
    v = verify(parse_policy(policy), dims, torch.bfloat16, use_cache=False)
    out[policy] = {"refused": v.refused, "failed": list(v.failed), "paths": v.paths.to_dict(),
                   "machine": v.fingerprint.describe()}
print(json.dumps(out))
"""


def _cells() -> list[tuple[dict[str, str], int]]:
    """Every setting at two threads (CI's count, where threads split reductions), the pinned default at one."""
    return [(setting, 2) for setting in _settings()] + [({}, 1)]


@pytest.mark.skipif(not HAS_AVX2, reason="the settings are x86-64's")
@pytest.mark.parametrize("setting, threads", _cells(), ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v))
def test_the_self_check_holds_under_every_isa_setting(setting: dict[str, str], threads: int) -> None:
    """Under each setting the CPU supports, in a fresh process: the invariant policy is never left without a
    verified path, and simulated replay keeps every primitive of split-K (a path that fails is replaced by
    one that passes)."""
    from dataclasses import asdict

    dims = json.dumps({k: (list(map(list, v)) if k == "projections" else v) for k, v in asdict(MEDIUM).items()})
    done = subprocess.run([sys.executable, "-c", SELFCHECK, dims], capture_output=True, text=True, cwd=ROOT,
                          timeout=900, check=False, env=_clean_env(**setting, OMP_NUM_THREADS=str(threads)))
    assert done.returncode == 0, done.stderr[-2000:]
    for policy, r in json.loads(done.stdout).items():
        assert not r["refused"] and not r["failed"], (setting, threads, policy, r)
        print(policy, r["paths"])


def test_resolve_engine_reads_its_verdict_from_the_cache(tiny) -> None:
    dims = probe_dims(tiny.config)
    first = resolve_engine(EngineSettings(), dims)
    again = resolve_engine(EngineSettings(), dims)
    assert again.verification.cached and again.paths == first.paths
    assert again.machine == first.machine
    fresh = verify(parse_policy("splitk"), dims, torch.bfloat16, use_cache=False)
    assert not fresh.cached and fresh.paths == first.paths
