"""The self-check: every row-invariance property a policy and the simulated replay rely on, verified on
this machine for the shapes the model uses, at the thread count in force — and the kernel paths that pass.

Which properties a policy needs:

- an op class under `invariant`: its fixed-order primitive is row-invariant (a row's bits do not depend
  on the batch size or its position), and for attention also chunked prefill = one prefill and decode =
  prefill. Without a path that passes, the policy is refused;
- every op class under `invariant` or `splitk`: row invariance of every order its plans use, so that rows
  of many steps can share a physical forward pass (simulated replay). Without it, compositions are
  replayed physically instead (one composition at a time: a step's rows are its own);
- `native`: nothing (its kernels depend on the physical batch by design; always replayed physically).

Each primitive is tried on its paths in order (flakecheck/kernels/paths.py), fast first; the first that
passes every probe is used. The verdict is cached under $FLAKECHECK_CACHE/selfcheck/ by the machine
fingerprint, the model's shapes, the dtype, the policy and the profile, so it costs seconds once.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from flakecheck.kernels.faults import active
from flakecheck.kernels.paths import CHOICES, KernelPaths
from flakecheck.kernels.plan import BLOCKED, FIXED
from flakecheck.kernels.policy import FIXED_ORDERS, KV_SPLIT_SIZE, KernelPolicy, matmul_order
from flakecheck.kernels.profiles import MAX_ROW_SPLITS, get_profile
from flakecheck.kernels.registry import get_ops
from flakecheck.kernels.tensor_parallel import TP_INVARIANT
from flakecheck.kernels.tiles import FP_FUSION
from flakecheck.machine import invariance_probes as probes
from flakecheck.machine.cache import cache_root
from flakecheck.machine.device import CPU, Device
from flakecheck.machine.fingerprint import MachineFingerprint, current, flakecheck_version
from flakecheck.machine.invariance_probes import BLOCK_ROWS, ProbeDims

# The Triton interpreter (TRITON_INTERPRET=1 on a CPU: a numpy emulation for tests) runs a kernel program by
# program in Python: the attention probe's 17 sequences of up to 640 keys take minutes there. It gets 6 of up
# to 320; the probed one (310 keys) still spans two fixed 256-key splits and several of 64. Its row probes
# take the light schedule (probes.LIGHT_BATCHES) and the LM head's first INTERPRETED_HEAD_COLUMNS columns:
# with the full ones the self-check of SmolLM2 under splitk ran for more than half an hour.
INTERPRETED_KV_PROBE = {"slots": 6, "length": 320, "probed": 310}
INTERPRETED_HEAD_COLUMNS = 1024
SPLIT_ATTENTION_SIZES = (64, 192, 256, 512)  # keys a split under splitk: one block, odd blocks, the fixed size, long
MAX_PLAN_ROWS = 2048  # rows of the largest step a plan is made for (the lockstep's pass)
HEAD_COLUMNS = 16384


@dataclass(frozen=True)
class PropertyResult:
    primitive: str  # a KernelPaths field: fbgemm, fixed_matmul, split_matmul, attention, norm, softmax
    path: str
    check: str  # what was compared, e.g. "rows 960x576 order 3", "attention chunking split 256"
    max_abs_diff: float

    @property
    def holds(self) -> bool:
        return self.max_abs_diff == 0.0


@dataclass(frozen=True)
class Verification:
    """What the self-check found on this machine for one (policy, model shapes, dtype)."""

    fingerprint: MachineFingerprint
    policy: str
    paths: KernelPaths  # the path each primitive takes
    results: tuple[PropertyResult, ...]  # every probe run, rejected paths included
    needed: tuple[str, ...]  # the primitives the policy relies on
    failed: tuple[str, ...]  # needed primitives for which no path passed
    invariant_failed: tuple[str, ...]  # of those, the ones an `invariant` op class needs (the policy is refused)
    seconds: float
    cached: bool = False

    @property
    def simulated(self) -> bool:
        """Whether rows of many steps may share a forward pass (simulated replay)."""
        return not self.failed

    @property
    def refused(self) -> bool:
        return bool(self.invariant_failed)

    def failure_of(self, primitive: str) -> PropertyResult | None:
        """The worst failed probe of a primitive's last path tried."""
        tried = [r for r in self.results if r.primitive == primitive]
        if not tried:
            return None
        last = [r for r in tried if r.path == tried[-1].path and not r.holds]
        return max(last, key=lambda r: r.max_abs_diff, default=None)

    def summary(self) -> str:
        """One line: what was verified, what fell back, what failed."""
        verified = [p for p in self.needed if p not in self.failed]
        parts = [f"verified {', '.join(verified) or 'nothing'} on {self.fingerprint.describe()}"]
        fallbacks = {k: v for k, v in self.paths.fallbacks().items() if k in self.needed}
        if fallbacks:
            parts.append("fallbacks: " + ", ".join(f"{k}={v}" for k, v in fallbacks.items()))
        if self.failed:
            parts.append("FAILED: " + ", ".join(self.failed))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint.to_dict(), "policy": self.policy, "paths": self.paths.to_dict(),
            "results": [asdict(r) for r in self.results], "needed": list(self.needed), "failed": list(self.failed),
            "invariant_failed": list(self.invariant_failed), "seconds": self.seconds, "cached": self.cached,
            "simulated": self.simulated,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verification:
        return cls(
            fingerprint=MachineFingerprint.from_dict(data["fingerprint"]), policy=str(data["policy"]),
            paths=KernelPaths.from_dict(data["paths"]),
            results=tuple(PropertyResult(**r) for r in data.get("results", [])),
            needed=tuple(data.get("needed", ())), failed=tuple(data.get("failed", ())),
            invariant_failed=tuple(data.get("invariant_failed", ())), seconds=float(data.get("seconds", 0.0)),
            cached=bool(data.get("cached", False)),
        )


@dataclass
class _Context:
    policy: KernelPolicy
    dims: ProbeDims
    dtype: torch.dtype
    sms: int
    make_ops: Callable[[KernelPaths], Any]
    device: Device = CPU  # where the probes' tensors are made and the kernels run
    kv_probe: dict[str, int] = field(default_factory=dict)  # the attention probe's size, when not the default
    backend: str = "torch"  # torch (the twins, with their CPU paths) or triton (one kernel a primitive)
    interpreted: bool = False  # Triton under its CPU interpreter: the lighter probes above
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    _data: dict[str, Any] = field(default_factory=dict)

    def data(self, key: str, make: Callable[[], Any]) -> Any:
        """Probe inputs made once (every path is probed on the same numbers)."""
        if key not in self._data:
            self._data[key] = make()
        return self._data[key]


def verify(policy: KernelPolicy, dims: ProbeDims, dtype: torch.dtype, profile: str = "h100",
           make_ops: Callable[[KernelPaths], Any] | None = None, use_cache: bool = True, device: Device = CPU,
           backend: str = "torch") -> Verification:
    """The self-check for `policy` on this machine's `device` (cpu or cuda:N) with the kernels of `backend`
    (resolved: torch or triton), from the cache when it was made before."""
    fingerprint = current(device)
    key = _cache_key(fingerprint, policy, dims, dtype, profile, backend)
    path = cache_dir() / f"{key}.json"
    if use_cache and path.is_file():
        try:
            return replace(Verification.from_dict(json.loads(path.read_text(encoding="utf-8"))), cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is made again
    if make_ops is None:
        def make_ops(paths: KernelPaths) -> Any:
            return get_ops(policy, backend, profile, paths=paths)

    interpreted = backend == "triton" and not device.is_cuda
    result = run_checks(_Context(policy, dims, dtype, get_profile(profile).sms, make_ops, device,
                                 INTERPRETED_KV_PROBE if interpreted else {}, backend, interpreted), fingerprint)
    if use_cache:
        _store(path, result)
    return result


def cache_dir() -> Path:
    return cache_root() / "selfcheck"


def _cache_key(fingerprint: MachineFingerprint, policy: KernelPolicy, dims: ProbeDims, dtype: torch.dtype,
               profile: str, backend: str) -> str:
    facts = {"fingerprint": fingerprint.to_dict(), "policy": policy.name, "dims": asdict(dims), "dtype": str(dtype),
             "profile": profile, "flakecheck": flakecheck_version(), "faults": sorted(active())}
    if backend != "torch":  # the torch twins' entries keep the key they always had
        # the compiler's version and its FMA contraction decide the kernels' bits (the fingerprint holds the version
        # too; named here so that a key never outlives either)
        facts.update(backend=backend, triton=fingerprint.triton, fp_fusion=FP_FUSION)
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _store(path: Path, result: Verification) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result.to_dict()), encoding="utf-8")
    tmp.replace(path)  # atomic: a concurrent run reads the old entry or the new one, never half


def run_checks(ctx: _Context, fingerprint: MachineFingerprint) -> Verification:
    started = time.perf_counter()
    policy = ctx.policy
    checks = _checks_by_primitive(ctx)
    needed = tuple(checks)
    chosen: dict[str, str] = {}
    results: list[PropertyResult] = []
    failed: list[str] = []
    for primitive, run in checks.items():
        for path in CHOICES[primitive]:
            paths = KernelPaths(**{**chosen, primitive: path})
            found = run(ctx.make_ops(paths), path)
            results.extend(found)
            if all(r.holds for r in found):
                chosen[primitive] = path
                break
        else:
            failed.append(primitive)
    if policy.matmul == "native":
        chosen["native_matmul"] = native_matmul_path(fingerprint)
    invariant_classes = {cls for cls in ("matmul", "attention", "norm") if getattr(policy, cls) in FIXED_ORDERS}
    invariant_failed = tuple(p for p in failed if _op_class(p) in invariant_classes)
    return Verification(fingerprint, policy.name, KernelPaths(**chosen), tuple(results), needed, tuple(failed),
                        invariant_failed, time.perf_counter() - started)


def native_matmul_path(fingerprint: MachineFingerprint) -> str:
    """ATen's own bf16 GEMM where the CPU has bf16 instructions (oneDNN runs it on AMX or AVX512-BF16: 1.4x
    transformers' generate beat flakecheck's FBGEMM path at batch 16 on such a Xeon), else FBGEMM's fp16 GEMM
    on exact copies (ATen's bf16 GEMM is a reference loop without them, 3-8x slower measured here). A rule,
    not a timing: timings on a shared machine swing more than the choice is worth."""
    return "aten" if {"amx_bf16", "avx512_bf16"} & set(fingerprint.isa) else "fbgemm"


def _op_class(primitive: str) -> str:
    return {"fbgemm": "matmul", "fixed_matmul": "matmul", "split_matmul": "matmul", "attention": "attention",
            "norm": "norm", "softmax": "norm"}[primitive]


Check = Callable[[Any, str], list[PropertyResult]]


def _checks_by_primitive(ctx: _Context) -> dict[str, Check]:
    """The primitives the policy relies on, each with the probes that must pass on a path."""
    policy, checks = ctx.policy, {}
    if policy.matmul == "invariant":
        if ctx.dtype != torch.float32 and ctx.backend == "torch":  # FBGEMM's path is the twins' alone
            checks["fbgemm"] = lambda ops, path: _matmul_checks(ctx, ops, "fbgemm", path, {FIXED})
        checks["fixed_matmul"] = lambda ops, path: _matmul_checks(ctx, ops, "fixed_matmul", path, {FIXED},
                                                                    fp32_path=True)
    elif policy.matmul in ("splitk", TP_INVARIANT):  # tp-invariant: split-K in fixed blocks
        checks["split_matmul"] = lambda ops, path: _matmul_checks(ctx, ops, "split_matmul", path, None)
    if policy.attention in ("splitk", *FIXED_ORDERS):
        checks["attention"] = lambda ops, path: _attention_checks(ctx, ops, path)
    if policy.norm in ("splitk", *FIXED_ORDERS):
        checks["norm"] = lambda ops, path: _norm_checks(ctx, ops, path)
        checks["softmax"] = lambda ops, path: _softmax_checks(ctx, ops, path)
    return checks


def split_orders(policy: KernelPolicy, n: int, k: int, sms: int) -> list[int]:
    """Every order the policy's plans give an (N, K) matmul, over steps of 1..MAX_PLAN_ROWS rows."""
    return sorted({matmul_order(policy, m, n, k, sms) for m in range(1, MAX_PLAN_ROWS + 1)})


def _matmul_checks(ctx: _Context, ops: Any, primitive: str, path: str, orders: set[int] | None,
                   fp32_path: bool = False) -> list[PropertyResult]:
    if primitive == "fbgemm" and path == "off":
        return []  # FIXED matmuls then all take the fp32 path, probed on its own
    if fp32_path:  # the fp32 GEMM path alone: weights FBGEMM cannot pack, and every fp32 model
        ops = ctx.make_ops(replace(ops.executor.paths, fbgemm="off"))
    found = []
    head_n, head_k = ctx.dims.lm_head
    # The LM head is probed at up to HEAD_COLUMNS of its columns: a GEMM cuts N into tiles (and threads) of
    # at most a few hundred columns, and what the property is about is each row's reduction over K.
    head_columns = INTERPRETED_HEAD_COLUMNS if ctx.interpreted else HEAD_COLUMNS
    for n, k in (*ctx.dims.projections, (min(head_n, head_columns), head_k)):
        weight = ctx.data(f"w{n}x{k}", lambda n=n, k=k: probes.packable_weight(ctx.gen, n, k, ctx.dtype,
                                                                                       ctx.device))
        # the copies each path reads, made once for all its orders
        prepared = ctx.data(f"w{n}x{k} {ops.executor.paths.fbgemm}", lambda w=weight: ops.prepare_linear(w))
        x = ctx.data(f"x{k}", lambda k=k: probes.random(ctx.gen, BLOCK_ROWS, k, dtype=ctx.dtype,
                                                                       device=ctx.device))
        for order in sorted(orders) if orders is not None else split_orders(ctx.policy, n, k, ctx.sms):
            found.append(PropertyResult(primitive, path, f"rows {n}x{k} order {order}",
                                        probes.linear_rows(ops, prepared, order, x, ctx.interpreted)))
    return found


def _attention_checks(ctx: _Context, ops: Any, path: str) -> list[PropertyResult]:
    kv = ctx.data("kv", lambda: probes.KVCacheProbe.make(ctx.gen, ctx.dims, ctx.dtype, ctx.device,
                                                                  **ctx.kv_probe))
    invariant = ctx.policy.attention in FIXED_ORDERS
    found = []
    for window in (None, *ctx.dims.windows):  # full attention, and each sliding window the model has
        named = "" if window is None else f" window {window}"
        for split in (KV_SPLIT_SIZE,) if invariant else SPLIT_ATTENTION_SIZES:
            found.append(PropertyResult("attention", path, f"attention rows split {split}{named}",
                                        probes.attention_rows(ops, kv, split, window)))
        if invariant:
            found.append(PropertyResult("attention", path, f"attention chunking split {KV_SPLIT_SIZE}{named}",
                                        probes.attention_chunking(ops, kv, KV_SPLIT_SIZE, window)))
            found.append(PropertyResult("attention", path, f"attention decode_vs_prefill split {KV_SPLIT_SIZE}{named}",
                                        probes.attention_decode_vs_prefill(ops, kv, KV_SPLIT_SIZE, window)))
    return found


def _norm_orders(policy: KernelPolicy, softmax: bool = False) -> list[int]:
    if policy.norm == TP_INVARIANT and softmax:
        return [BLOCKED]
    return [FIXED] if policy.norm in FIXED_ORDERS else list(range(1, MAX_ROW_SPLITS + 1))


def _norm_checks(ctx: _Context, ops: Any, path: str) -> list[PropertyResult]:
    found = []
    for width in ctx.dims.norm_widths:
        weight = ctx.data(f"norm{width}", lambda width=width: probes.random(ctx.gen, width, dtype=ctx.dtype,
                                                                             scale=0.1, device=ctx.device) + 1)
        x = ctx.data(f"x{width}", lambda width=width: probes.random(ctx.gen, BLOCK_ROWS, width, dtype=ctx.dtype,
                                                                           device=ctx.device))
        for order in _norm_orders(ctx.policy):
            found.append(PropertyResult("norm", path, f"rmsnorm rows {width} order {order}",
                                        probes.rmsnorm_rows(ops, weight, order, x, ctx.interpreted)))
    return found


def _softmax_checks(ctx: _Context, ops: Any, path: str) -> list[PropertyResult]:
    logits = ctx.data("logits", lambda: probes.random(ctx.gen, BLOCK_ROWS, ctx.dims.vocab, dtype=ctx.dtype,
                                                      scale=4.0, device=ctx.device))
    return [PropertyResult("softmax", path, f"log_softmax rows {ctx.dims.vocab} order {order}",
                           probes.log_softmax_rows(ops, order, logits, ctx.interpreted))
            for order in _norm_orders(ctx.policy, softmax=True)]
