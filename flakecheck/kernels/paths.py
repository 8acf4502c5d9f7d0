"""Which implementation runs each order of a plan on this machine.

The fast implementations (the first of each list) rest on measured library behaviour: a GEMM's rows are
the same bits whatever M is once padded to a block, ATen's row reductions give a row the same bits in any
batch. That holds on the machines it was measured on, not by construction, so the self-check
(flakecheck.machine.selfcheck) verifies the one a run uses, on the run's machine, and where it fails
picks the next one that passes: the later entries are invariant by construction (every GEMM called with
one fixed tile shape; reductions written as elementwise adds), slower, never wrong.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# FIXED matmuls of weights FBGEMM can pack exactly (bf16/fp16): FBGEMM's fp16 GEMM with rows padded off
# its 1- and 2-row kernels, or not at all ("off": they take the fp32 path below)
FBGEMM = ("padded", "off")
# FIXED matmuls on fp32 copies: rows padded to 8 in one GEMM | 16-row tiles, one GEMM each | one row a call
FIXED_MATMUL = ("padded", "tiled", "rowwise")
# split-K partial GEMMs: one batched GEMM over the K ranges | each range in 16-row tiles | one row a call
SPLIT_MATMUL = ("batched", "tiled", "rowwise")
# attention: batched matmuls over 64-key blocks with query rows padded to 4 | in fixed 16-row tiles with
# elementwise sums
ATTENTION = ("blocks", "tiled")
# native matmuls of bf16/fp16 weights (no property, only speed; flakecheck.machine.selfcheck chooses by the
# CPU's ISA): FBGEMM's fp16 GEMM on exact fp16 copies (fast where the CPU has no bf16 instructions) | ATen's
# own GEMM (oneDNN, on AMX or AVX512-BF16 where the CPU has them)
NATIVE_MATMUL = ("fbgemm", "aten")
# RMSNorm, and the log-softmax over the vocabulary: ATen's row kernels | elementwise adds over fixed lanes
NORM = ("aten", "lanes")
SOFTMAX = ("aten", "lanes")

CHOICES: dict[str, tuple[str, ...]] = {"fbgemm": FBGEMM, "fixed_matmul": FIXED_MATMUL,
                                       "split_matmul": SPLIT_MATMUL, "attention": ATTENTION,
                                       "norm": NORM, "softmax": SOFTMAX, "native_matmul": NATIVE_MATMUL}


@dataclass(frozen=True)
class KernelPaths:
    fbgemm: str = FBGEMM[0]
    fixed_matmul: str = FIXED_MATMUL[0]
    split_matmul: str = SPLIT_MATMUL[0]
    attention: str = ATTENTION[0]
    norm: str = NORM[0]
    softmax: str = SOFTMAX[0]
    native_matmul: str = NATIVE_MATMUL[0]

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) not in CHOICES[f.name]:
                raise ValueError(f"unknown {f.name} path {getattr(self, f.name)!r}; "
                                 f"choose among {', '.join(CHOICES[f.name])}")

    def fallbacks(self) -> dict[str, str]:
        """The primitives not on their fast path, and the path they take."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != CHOICES[f.name][0]}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelPaths:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


FAST = KernelPaths()
