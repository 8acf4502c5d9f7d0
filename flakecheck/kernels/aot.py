"""Ahead-of-time compilation of a Triton launch configuration for an NVIDIA target, on a machine without a GPU.

`triton.compile` runs Triton's whole pipeline (TTIR, TTGIR, LLVM IR, PTX) and the ptxas in Triton's wheel
(the cubin); `ptxas -v` on the same PTX with the same flags reports registers and spills, Triton's metadata the
shared memory. Nothing here launches a kernel: what the compiled code computes is for a GPU to show.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
from triton.compiler import ASTSource

from flakecheck.kernels import triton_kernels
from flakecheck.kernels.launches import Launch
from flakecheck.kernels.tiles import FP_FUSION

# Per target: shared memory a block may opt into, and SMs of the GPU named (the CUDA C++ Programming Guide's
# table of compute capabilities; SM counts of the A100, L4, H100 SXM, B200 and RTX 5090)
TARGETS: dict[str, dict[str, Any]] = {
    "sm_80": {"capability": 80, "max_shared": 163 * 1024, "sms": 108, "gpu": "A100"},
    "sm_89": {"capability": 89, "max_shared": 99 * 1024, "sms": 58, "gpu": "L4, RTX 4090"},
    "sm_90": {"capability": 90, "max_shared": 227 * 1024, "sms": 132, "gpu": "H100, H200"},
    "sm_100": {"capability": 100, "max_shared": 227 * 1024, "sms": 148, "gpu": "B200"},
    "sm_120": {"capability": 120, "max_shared": 99 * 1024, "sms": 170, "gpu": "RTX 50"},
}
DEFAULT_TARGETS = ("sm_80", "sm_89", "sm_90", "sm_100")
_ATOMIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.", re.MULTILINE)
_CTAID = re.compile(r"%ctaid\.([xyz])")
_TENSOR_CORE = (("wgmma", re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)")),
                ("tcgen05.mma", re.compile(r"tcgen05\.mma\.cta_group::(\d)")),
                ("mma.sync", re.compile(r"\bmma\.sync\.aligned\.(m\d+n\d+k\d+)")))


@dataclass(frozen=True)
class Compiled:
    """What compiling one launch configuration for one target gave."""

    kernel: str
    config: str
    target: str
    instruction: str  # the tensor-core instructions of its dots ("-": none)
    registers: int
    spill_bytes: int  # ptxas's spill stores
    shared: int
    max_shared: int
    atomics: int = 0  # atom./red. instructions: a reduction whose order is whichever program comes first
    grid_axes: tuple[str, ...] = ()  # the program ids it reads (%ctaid.x ...)
    fixed_order: bool = False  # a fixed-order kernel: one grid axis, so no program holds part of a row's reduction
    error: str | None = None

    @property
    def fits(self) -> bool:
        return self.error is None and self.spill_bytes == 0 and self.shared <= self.max_shared

    @property
    def order_ok(self) -> bool:
        """No atomics; a fixed-order kernel's programs each own whole rows (one grid axis)."""
        return self.atomics == 0 and (not self.fixed_order or len(self.grid_axes) <= 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "order_ok": self.order_ok}


def signature(launch: Launch) -> tuple[dict[str, str], dict[str, Any]]:
    """Triton's signature and constexprs of a launch, from the kernel's own argument names."""
    fn = getattr(triton_kernels, launch.kernel)
    constexprs, pointers = dict(launch.constexprs), dict(launch.pointers)
    unset = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs]
    if unset:
        raise ValueError(f"{launch.kernel}: no value for its constexpr {', '.join(unset)} "
                         "(flakecheck/kernels/launches.py)")
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            if name not in pointers:
                raise ValueError(f"{launch.kernel}: no element type for its pointer argument {name!r} "
                                 "(flakecheck/kernels/launches.py)")
            sig[name] = f"*{pointers[name]}"
        else:
            sig[name] = "fp32" if name in launch.floats else "i32"
    return sig, constexprs


def compile_launch(launch: Launch, target: str) -> tuple[Compiled, str]:
    """The launch compiled for `target` (sm_80 ...), and its PTX ("" when it did not compile)."""
    spec = TARGETS[target]
    try:
        sig, constexprs = signature(launch)
        kernel = triton.compile(ASTSource(getattr(triton_kernels, launch.kernel), sig, constexprs),
                                target=GPUTarget("cuda", spec["capability"], 32),
                                options={"num_warps": launch.num_warps, "enable_fp_fusion": FP_FUSION})
        ptx = kernel.asm["ptx"]
        registers, spills = ptxas_usage(ptx, spec["capability"])
    except Exception as exc:  # noqa: BLE001 - Triton's and ptxas's errors have no common type: each is a result
        first = str(exc).strip().splitlines()
        return Compiled(launch.kernel, launch.label, target, "-", 0, 0, 0, spec["max_shared"],
                        fixed_order=launch.fixed_order, error=f"{type(exc).__name__}: {first[0] if first else ''}"), ""
    return Compiled(launch.kernel, launch.label, target, instruction(ptx), registers, spills,
                    int(kernel.metadata.shared), spec["max_shared"], atomics(ptx), grid_axes(ptx),
                    launch.fixed_order), ptx


def instruction(ptx: str) -> str:
    """The tensor-core instructions in a PTX text, e.g. "wgmma m64n64k16", or "-"."""
    found = []
    for name, pattern in _TENSOR_CORE:
        for shape in sorted(set(pattern.findall(ptx))):
            found.append(name if name == "tcgen05.mma" else f"{name} {shape}")
    return " + ".join(found) or "-"


def atomics(ptx: str) -> int:
    """Atomic instructions in a PTX text (`atom.add`, `red.global.add`, predicated or not)."""
    return len(_ATOMIC.findall(ptx))


def grid_axes(ptx: str) -> tuple[str, ...]:
    """The grid axes whose program id a PTX text reads."""
    return tuple(sorted(set(_CTAID.findall(ptx))))


def ptxas_usage(ptx: str, capability: int) -> tuple[int, int]:
    """Registers a thread and spill-store bytes, from `ptxas -v` with the flags Triton compiles with."""
    fmad = [] if FP_FUSION else ["--fmad=false"]
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{tmp}/kernel.ptx"
        with open(src, "w", encoding="utf-8") as f:
            f.write(ptx)
        done = subprocess.run([get_ptxas(capability).path, "-v", *fmad, "--regAllocOptLevel=2",
                               f"--gpu-name={sm_arch_from_capability(capability)}", src, "-o", f"{tmp}/kernel.cubin"],
                              capture_output=True, text=True, check=True)
    registers = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores", done.stderr)
    if registers is None:
        raise RuntimeError(f"ptxas -v reported no register count: {done.stderr.strip()[:200]}")
    return int(registers.group(1)), int(spills.group(1)) if spills else 0
