"""`flakecheck kernels compile`: every Triton kernel x every launch configuration the engine uses for the covered
models, compiled ahead of time for NVIDIA targets on this machine (no GPU needed).

Prints one row per (kernel, configuration, target): the tensor-core instruction of its dots, registers, spills,
shared memory and whether it fits the SM; then each matmul's instruction boundaries (the M where the
instruction changes as a batch grows) and whether the self-check probes rows on both sides of each.
Exit 1 when a configuration fails to compile, spills, exceeds the target's shared memory, holds an atomic
instruction, or is a fixed-order kernel reading a second grid axis (a program holding part of a row's
reduction), or when a boundary is not straddled by the self-check's probes; 2 on an unknown target.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.table import Table

from flakecheck.console import output_console
from flakecheck.errors import UserError
from flakecheck.kernels.aot import DEFAULT_TARGETS, TARGETS, Compiled, compile_launch
from flakecheck.kernels.launches import MATMULS, Launch, ModelShapes, compiled_models, launches
from flakecheck.kernels.tiles import FP_FUSION, boundary_rows


@dataclass(frozen=True)
class Boundary:
    """Where a matmul's instruction changes on a target: M rows use `below`, M + 1 `above`."""

    kernel: str
    target: str
    rows: int
    below: str
    above: str
    probed: bool  # the self-check probes M and M + 1 rows

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "target": self.target, "rows": self.rows, "below": self.below,
                "above": self.above, "probed": self.probed}


def parse_targets(text: str) -> tuple[str, ...]:
    """`sm_80,sm_90` -> the targets; UserError (exit 2) naming an unknown one."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise UserError(f"--target: unknown target {', '.join(unknown) or '(none)'}; choose among "
                        f"{', '.join(TARGETS)}")
    return targets


def compile_all(targets: tuple[str, ...], models: tuple[ModelShapes, ...],
                jobs: int | None = None) -> list[tuple[Launch, Compiled]]:
    """Every launch of `models` compiled for every target, in parallel processes (Triton's compiler and ptxas
    are single-threaded)."""
    work = [(launch, target) for target in targets for launch in launches(models, TARGETS[target]["sms"])]
    workers = jobs or os.cpu_count() or 1
    if workers == 1:
        return [(launch, _compile(launch, target)) for launch, target in work]
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_compile, *zip(*work, strict=True)))
    return [(launch, compiled) for (launch, _), compiled in zip(work, results, strict=True)]


def _compile(launch: Launch, target: str) -> Compiled:
    return compile_launch(launch, target)[0]


def boundaries(results: list[tuple[Launch, Compiled]]) -> list[Boundary]:
    """Each matmul's instruction changes over M, per target, and whether the self-check probes both sides."""
    probed = set(boundary_rows("triton", interpreted=False))
    found = []
    for kernel in MATMULS:
        for target in dict.fromkeys(c.target for _, c in results):
            classes = sorted(((launch.rows, c.instruction) for launch, c in results
                              if c.kernel == kernel and c.target == target and launch.rows is not None),
                             key=lambda item: item[0][0])
            for (lower, below), (_, above) in zip(classes, classes[1:], strict=False):
                if below != above:
                    m = lower[1]
                    found.append(Boundary(kernel, target, m, below, above, {m, m + 1} <= probed))
    return found


def compile_command(targets: str = ",".join(DEFAULT_TARGETS), json_out: bool = False, jobs: int | None = None) -> int:
    chosen = parse_targets(targets)
    models = compiled_models()
    results = compile_all(chosen, models, jobs)
    edges = boundaries(results)
    failed = [c for _, c in results if not (c.fits and c.order_ok)] + [b for b in edges if not b.probed]
    if json_out:
        print(json.dumps({"targets": list(chosen), "fp_fusion": FP_FUSION,
                          "models": [{"name": m.name, "source": m.source} for m in models],
                          "kernels": [c.to_dict() for _, c in results],
                          "boundaries": [b.to_dict() for b in edges], "ok": not failed}))
    else:
        _print(results, edges, models)
    return 1 if failed else 0


def _print(results: list[tuple[Launch, Compiled]], edges: list[Boundary], models: tuple[ModelShapes, ...]) -> None:
    console = output_console()
    table = Table(title=f"Triton kernels compiled ahead of time (bf16, enable_fp_fusion={FP_FUSION})")
    for column in ("kernel", "configuration", "target", "instruction", "registers", "spills", "shared", "fits"):
        table.add_column(column, justify="right" if column in ("registers", "spills", "shared") else "left",
                         no_wrap=column in ("kernel", "target", "instruction"))
    for _, c in results:
        fits = "[green]yes[/]" if c.fits else f"[bold red]NO[/] {escape(c.error or '')}"
        if not c.order_ok:
            fits += f" [bold red]{c.atomics} atomics, grid axes {','.join(c.grid_axes)}[/]"
        table.add_row(_short(c.kernel), c.config, c.target, c.instruction, str(c.registers),
                      f"{c.spill_bytes} B", f"{c.shared} B / {c.max_shared // 1024} KiB", fits)
    console.print(table)
    console.print("models: " + "; ".join(f"{m.name} ({m.source})" for m in models))
    if not edges:
        console.print("instruction boundaries: none (one instruction for every M on every target)")
    for b in edges:
        probed = "[green]probed both sides[/]" if b.probed else "[bold red]NOT probed by the self-check[/]"
        console.print(f"instruction boundary: {_short(b.kernel)} on {b.target} at M {b.rows}/{b.rows + 1}: "
                      f"{b.below} -> {b.above} — {probed}")
    bad = sum(1 for _, c in results if not (c.fits and c.order_ok))
    console.print(f"{len(results) - bad}/{len(results)} configurations compile and fit, without atomics, the "
                  "fixed-order ones on one grid axis")


def _short(kernel: str) -> str:
    """_matmul_persistent_kernel -> matmul_persistent"""
    return kernel.strip("_").removesuffix("_kernel")
