"""The Triton kernels compiled ahead of time for NVIDIA targets (no GPU): `flakecheck kernels compile` passes for
sm_80, sm_89, sm_90 and sm_100 and fails on a broken configuration; the fixed-order kernels' PTX holds no
atomics and no split of a row's reduction across programs; the self-check's matmul probes straddle every
instruction boundary the check reports; the FP-fusion setting reaches every launch, the compiler, meta.json
and the self-check's cache key."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flakecheck.errors import UserError  # noqa: E402
from flakecheck.kernels import compile_check, launches, tiles  # noqa: E402
from flakecheck.kernels.aot import DEFAULT_TARGETS, atomics, compile_launch, grid_axes  # noqa: E402
from flakecheck.kernels.launches import Launch, compiled_models  # noqa: E402
from flakecheck.kernels.plan import FIXED  # noqa: E402
from flakecheck.kernels.weights import LinearWeights  # noqa: E402
from flakecheck.machine import invariance_probes as probes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report() -> dict:
    """The check as CI runs it: every default target, JSON out."""
    done = subprocess.run([sys.executable, "-m", "flakecheck", "kernels", "compile", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_kernel_compiles_and_fits_every_target(report: dict) -> None:
    assert report["ok"] and report["targets"] == list(DEFAULT_TARGETS)
    kernels = {k["kernel"] for k in report["kernels"]}
    assert kernels == {"_matmul_persistent_kernel", "_matmul_splitk_kernel", "_rmsnorm_kernel",
                       "_log_softmax_kernel", "_attention_split_kernel"}
    for k in report["kernels"]:
        assert k["error"] is None and k["spill_bytes"] == 0 and k["shared"] <= k["max_shared"], k
        assert 0 < k["registers"] <= 255, k
    # the dots reach tensor cores on every target (an FMA fallback would be a silent slow path)
    for k in report["kernels"]:
        if k["kernel"].startswith("_matmul"):
            assert k["instruction"] != "-", k


def test_self_check_probes_straddle_every_reported_boundary(report: dict) -> None:
    edges = report["boundaries"]
    assert any(b["target"] == "sm_90" for b in edges), "sm_90 has changed instruction with M since Triton 3.x"
    seen: list[int] = []

    def linear(r: torch.Tensor, w: LinearWeights, groups: object) -> torch.Tensor:
        seen.append(r.shape[0])
        return r @ w.weight.T

    ops = SimpleNamespace(executor=SimpleNamespace(name="triton", interpreted=False), linear=linear)
    gen = torch.Generator().manual_seed(0)
    x = probes.random(gen, probes.BLOCK_ROWS, 8, dtype=torch.float32)
    w = LinearWeights(probes.random(gen, 4, 8, dtype=torch.float32), None, None, None)
    probes.linear_rows(ops, w, FIXED, x)
    for b in edges:
        assert {b["rows"], b["rows"] + 1} <= set(seen), b
        assert b["probed"], b


def test_a_spilling_configuration_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    # 128x128 tiles on 4 warps: the configuration before this check existed, which spills on sm_90
    monkeypatch.setattr(launches, "matmul_tiles",
                        lambda m: tiles.matmul_tiles(m) if m <= 128 else tiles.MatmulTiles(128, 128, 4))
    monkeypatch.setattr(compile_check, "compiled_models", lambda: compiled_models()[:1])
    assert compile_check.compile_command("sm_90", json_out=True, jobs=1) == 1
    out = json.loads(capsys.readouterr().out)
    bad = [k for k in out["kernels"] if not k["fits"]]
    assert bad and all("BLOCK_M=128 BLOCK_N=128" in k["config"] and k["spill_bytes"] > 0 for k in bad)


def test_a_configuration_that_does_not_compile_exits_1(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    broken = Launch("_rmsnorm_kernel", (("BLOCK", 1000), ("PARTS", 1)), 4,
                    (("x_ptr", "bf16"), ("w_ptr", "bf16"), ("y_ptr", "bf16")), ("eps",))  # not a power of 2
    unset = replace(broken, constexprs=(("BLOCK", 1024),))  # PARTS, a constexpr of the kernel, given no value
    monkeypatch.setattr(compile_check, "launches", lambda models, sms: [broken, unset])
    assert compile_check.compile_command("sm_80", json_out=True, jobs=1) == 1
    errors = [k["error"] for k in json.loads(capsys.readouterr().out)["kernels"]]
    assert errors[0] and "PARTS" in errors[1]


def test_unknown_target_is_bad_input() -> None:
    with pytest.raises(UserError, match="sm_75"):
        compile_check.parse_targets("sm_90,sm_75")


@triton.jit
def _atomic_sum_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    tl.atomic_add(y_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, BLOCK)), axis=0))


def test_fixed_order_ptx_has_no_atomics_and_no_split_axis() -> None:
    """A reduction split across programs needs a grid axis besides the one over tiles (rows), and combining its
    parts by atomics makes their order the programs' race: the fixed-order kernels' PTX has neither. The
    split-K kernel's split count follows M (the host's heuristic); its PTX reads the third grid axis."""
    fixed = [launch for launch in launches.launches(compiled_models(), 132) if launch.fixed_order]
    assert {launch.kernel for launch in fixed} == {"_matmul_persistent_kernel", "_rmsnorm_kernel",
                                                   "_log_softmax_kernel"}
    for target in ("sm_90", "sm_100"):
        for launch in fixed:
            compiled, ptx = compile_launch(launch, target)
            assert compiled.error is None
            assert atomics(ptx) == 0 and grid_axes(ptx) == ("x",), (launch.label, target)
    # the reading finds what it looks for
    splitk = next(launch for launch in launches.launches(compiled_models(), 132)
                  if launch.kernel == "_matmul_splitk_kernel")
    assert grid_axes(compile_launch(splitk, "sm_90")[1]) == ("x", "y", "z")
    atomic = triton.compile(triton.compiler.ASTSource(_atomic_sum_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32",
                                                                           "BLOCK": "constexpr"}, {"BLOCK": 64}),
                            target=triton.backends.compiler.GPUTarget("cuda", 90, 32),
                            options={"enable_fp_fusion": False})
    assert atomics(atomic.asm["ptx"]) > 0


def _reduction_loops(launch: Launch) -> list[tuple[str, str, str]]:
    """(from, to, step) of every loop that carries values (a reduction) in the launch's Triton IR, which names
    the loops the PTX only branches through."""
    from flakecheck.kernels import aot

    compiled = triton.compile(triton.compiler.ASTSource(getattr(aot.triton_kernels, launch.kernel),
                                                        *aot.signature(launch)),
                              target=triton.backends.compiler.GPUTarget("cuda", 90, 32),
                              options={"num_warps": launch.num_warps, "enable_fp_fusion": tiles.FP_FUSION})
    return re.findall(r"scf\.for %\w+ = (%\w+) to (%\w+) step (%\w+) iter_args", compiled.asm["ttir"])


def test_fixed_order_matmul_reduces_over_k_alone() -> None:
    """Each tile class's reduction loop runs from 0 to K in constant steps: no M (nor program id) in its bounds,
    so no split count that depends on M. The split-K kernel's loop starts at its split's offset."""
    for launch in launches.launches(compiled_models()[:1], 132):
        if launch.kernel == "_matmul_persistent_kernel":
            loops = _reduction_loops(launch)
            assert loops and all(lo.startswith("%c0_") and hi == "%K" and re.fullmatch(r"%c\d+_i32", step)
                                 for lo, hi, step in loops), (launch.label, loops)
        if launch.kernel == "_matmul_splitk_kernel":
            loops = _reduction_loops(launch)
            assert loops and all(lo == "%k_lo" for lo, _, _ in loops), loops


def test_every_launch_passes_the_fp_fusion_setting() -> None:
    source = (ROOT / "flakecheck" / "kernels" / "triton_kernels.py").read_text(encoding="utf-8")
    launches_found = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Subscript)]  # kernel[grid](...)
    assert len(launches_found) >= 5
    for call in launches_found:
        passed = {kw.arg: kw.value for kw in call.keywords}
        assert "enable_fp_fusion" in passed and ast.unparse(passed["enable_fp_fusion"]) == "FP_FUSION", \
            ast.unparse(call.func)


def test_the_fusion_setting_reaches_the_compiler() -> None:
    """Contraction on leaves FMAs in the attention kernel's PTX; the pinned setting (off) none."""
    launch = next(launch for launch in launches.launches(compiled_models()[:1], 132)
                  if launch.kernel == "_attention_split_kernel")
    ptx = compile_launch(launch, "sm_90")[1]
    assert tiles.FP_FUSION is False and "fma.rn" not in ptx
    from flakecheck.kernels import aot

    fused = triton.compile(triton.compiler.ASTSource(getattr(aot.triton_kernels, launch.kernel),
                                                     *aot.signature(launch)),
                           target=triton.backends.compiler.GPUTarget("cuda", 90, 32),
                           options={"enable_fp_fusion": True})
    assert "fma.rn" in fused.asm["ptx"]


def test_meta_json_and_the_cache_key_hold_triton_and_its_fusion(monkeypatch: pytest.MonkeyPatch) -> None:
    from flakecheck.engine.spec import EngineSpec
    from flakecheck.kernels.paths import FAST
    from flakecheck.kernels.policy import KernelPolicy
    from flakecheck.machine import selfcheck
    from flakecheck.machine.device import CPU, Device
    from flakecheck.machine.fingerprint import current
    from flakecheck.machine.invariance_probes import SMOLLM2

    machine = current()
    verification = selfcheck.Verification(machine, "invariant", FAST, (), (), (), (), 0.0)
    policy = KernelPolicy.of("invariant")
    block = EngineSpec(policy, "triton", Device("cuda:0"), "h100", "bfloat16", verification).to_dict()["triton"]
    assert block == {"version": triton.__version__, "enable_fp_fusion": tiles.FP_FUSION}
    assert EngineSpec(policy, "torch", CPU, "h100", "bfloat16", verification).to_dict()["triton"] is None

    def key() -> str:
        return selfcheck._cache_key(machine, policy, SMOLLM2, torch.bfloat16, "h100", "triton")

    pinned = key()
    monkeypatch.setattr(selfcheck, "FP_FUSION", not tiles.FP_FUSION)
    assert key() != pinned
    monkeypatch.setattr(selfcheck, "FP_FUSION", tiles.FP_FUSION)
    assert key() == pinned
    machine = replace(machine, triton="0.0.0")
    assert key() != pinned
