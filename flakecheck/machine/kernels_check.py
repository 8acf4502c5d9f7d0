"""`flakecheck kernels check`: on this machine, which ops are batch-invariant under each policy, and what a
run would verify and fall back to.

Two parts, both on the default model's shapes (SmolLM2-135M: hidden 576, intermediate 1536, 9 heads / 3 KV
heads of 64, vocab 49152):

- the matrix: every op under each policy as a run plans it (the policy picks its own orders per call), on
  the kernel paths the self-check chose — rows computed in batches of every size and position against one
  batch, and for attention chunked prefill and decode against prefill. `invariant` must show 0 everywhere,
  `splitk` is expected to vary, `native` is whatever the hardware does;
- the self-check's verdict for `invariant` and `splitk` (the one `run`, `serve` and `explain` act on): the
  machine's fingerprint, what was verified, which primitives fell back to a slower path, what failed.

Exit 1 when the invariant policy is not invariant here (a silent gap must be loud).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flakecheck.errors import UserError
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import FAST
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy
from flakecheck.kernels.profiles import DEFAULT_PROFILE
from flakecheck.kernels.registry import DTYPES, backend_for, get_ops, resolve_backend
from flakecheck.machine import invariance_probes as probes
from flakecheck.machine.device import CPU, Device, profile_of
from flakecheck.machine.invariance_probes import BLOCK_ROWS, SMOLLM2
from flakecheck.machine.selfcheck import Verification, verify

VERIFIED = ("invariant", "splitk")


def check_command(device: Device = CPU, dtype: str = "bfloat16", backend: str = "auto", json_out: bool = False,
                  fresh: bool = False, policies: tuple[KernelPolicy, ...] = ()) -> int:
    """`device` resolved, `policies` parsed (the CLI's --kernels): measured and self-checked beside the
    whole-model ones."""
    resolved = _check(device, dtype, backend)
    torch_dtype = getattr(torch, dtype)
    profile = profile_of(device)  # a GPU's own split heuristics
    matrix = {**UNIFORM_POLICIES, **{p.name: p for p in policies}}
    verdicts = {name: verify(matrix[name], SMOLLM2, torch_dtype, profile, use_cache=not fresh, device=device,
                             backend=backend_for(matrix[name], resolved, device))
                for name in (*VERIFIED, *(p.name for p in policies))}
    results = run_matrix(device, torch_dtype, resolved, verdicts, profile, matrix)
    fingerprint = verdicts["invariant"].fingerprint
    if json_out:
        print(json.dumps({"device": device, "dtype": dtype, "machine": fingerprint.to_dict(),
                          "machine_summary": fingerprint.describe(), "results": results,
                          "selfcheck": {p: v.to_dict() for p, v in verdicts.items()}}))
    else:
        _print(results, device, dtype, backend, verdicts, tuple(matrix))
    failed = [r for r in results if r["policy"] == "invariant" and not r["invariant"]]
    return 1 if failed or verdicts["invariant"].refused else 0


def _check(device: Device, dtype: str, backend: str) -> str:
    """The backend resolved for the device; UserError (exit 2) naming the first bad option."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    try:
        return resolve_backend(backend, device)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def run_matrix(device: Device, dtype: torch.dtype, backend: str, verdicts: dict[str, Verification],
               profile: str = DEFAULT_PROFILE, matrix: dict[str, KernelPolicy] = UNIFORM_POLICIES,
               ) -> list[dict[str, Any]]:
    """Every (policy, op, check) of the matrix with its largest difference."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    checks = _checks(gen, dtype, device)
    results = []
    for policy, kernel_policy in matrix.items():
        paths = verdicts[policy].paths if policy in verdicts else FAST
        ops = get_ops(kernel_policy, backend_for(kernel_policy, backend, device), profile, paths=paths)
        for (op, check), probe in checks.items():
            diff = probe(ops)
            results.append({"policy": policy, "op": op, "check": check, "invariant": diff == 0.0,
                            "max_abs_diff": diff})
    return results


def _checks(gen: torch.Generator, dtype: torch.dtype,
            device: Device) -> dict[tuple[str, str], Callable[[Ops], float]]:
    dims = SMOLLM2
    weights = [probes.packable_weight(gen, n, k, dtype, device) for n, k in (*dims.projections, dims.lm_head)]
    hidden = dims.lm_head[1]
    x = {k: probes.random(gen, BLOCK_ROWS, k, dtype=dtype, device=device)
         for k in sorted({k for _, k in (*dims.projections, dims.lm_head)})}
    norm_w = probes.random(gen, hidden, dtype=dtype, scale=0.1, device=device) + 1
    logits = probes.random(gen, BLOCK_ROWS, dims.vocab, dtype=dtype, scale=4.0, device=device)
    kv = probes.KVCacheProbe.make(gen, dims, dtype, device)

    def matmul(ops: Ops) -> float:
        # every projection and the LM head, each order planned by the policy from the call's row count
        return max(probes.rows(lambda r, w=ops.prepare_linear(w): ops.linear(r, w), x[w.shape[1]]) for w in weights)

    return {
        ("matmul", "rows"): matmul,
        ("attention", "rows"): lambda ops: probes.attention_rows(ops, kv, None),
        ("attention", "chunking"): lambda ops: probes.attention_chunking(ops, kv, None),
        ("attention", "decode_vs_prefill"): lambda ops: probes.attention_decode_vs_prefill(ops, kv, None),
        ("rmsnorm", "rows"): lambda ops: probes.rows(lambda r: ops.rmsnorm(r, norm_w, 1e-5), x[hidden]),
        ("log_softmax", "rows"): lambda ops: probes.rows(lambda r: ops.log_softmax(r), logits),
    }


def _print(results: list[dict[str, Any]], device: Device, dtype: str, backend: str,
           verdicts: dict[str, Verification], columns: tuple[str, ...]) -> None:
    table = Table(title=f"kernel invariance probes — device {device}, dtype {dtype}, backend {backend}")
    table.add_column("op")
    table.add_column("check")
    for policy in columns:
        table.add_column(policy, justify="right")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in results:
        ok = r["invariant"]
        if r["policy"] == "invariant":
            text = "[green]invariant[/]" if ok else f"[bold red]FAIL {r['max_abs_diff']:.2e}[/]"
        else:
            text = "invariant" if ok else f"[yellow]varies {r['max_abs_diff']:.2e}[/]"
        cells.setdefault((r["op"], r["check"]), {})[r["policy"]] = text
    for (op, check), row in cells.items():
        table.add_row(op, check, *(row[p] for p in columns))
    console = Console()
    console.print(table)
    total = len(cells)
    failed = sum(1 for r in results if r["policy"] == "invariant" and not r["invariant"])
    varied = sum(1 for r in results if r["policy"] == "splitk" and not r["invariant"])
    console.print(f"invariant policy: {total - failed}/{total} probes bitwise invariant; splitk varies on {varied}")
    console.print(f"machine: {escape(verdicts['invariant'].fingerprint.describe())}")
    for policy, v in verdicts.items():
        verdict = "[bold red]REFUSED[/]" if v.refused else ("[green]ok[/]" if v.simulated else "[yellow]physical "
                                                                                              "replay only[/]")
        cached = " (cached)" if v.cached else f" ({v.seconds:.1f} s)"
        console.print(f"self-check {policy}: {verdict}{cached} — {escape(v.summary())}")
        for primitive in v.failed:
            worst = v.failure_of(primitive)
            if worst is not None:
                console.print(f"  {primitive}: {escape(worst.check)} differs by up to {worst.max_abs_diff:.3g}")
