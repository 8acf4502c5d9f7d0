"""Reproducibility settings of the math libraries, pinned before torch loads.

The same BLAS call picks other kernels on another ISA, thread count or data alignment, and the
bitwise promises (fixed-order kernels; simulated = physical replay) are properties of those kernels.
What each library offers to take that choice away is set here, in the environment, before the first
kernel runs (they read it once, at their first call):

- MKL's Conditional Numerical Reproducibility in strict mode, `MKL_CBWR=AVX2,STRICT`: results that do
  not depend on the data's alignment or the thread count, on one code branch. MKL takes the AVX2
  branch on Intel CPUs; on other vendors' it refuses that branch (measured on an AMD EPYC:
  mkl_cbwr_set answers "unsupported branch") and keeps its automatic one, still strict.
- FBGEMM's fp16 GEMM (`FBGEMM_ENABLE_INSTRUCTIONS=AVX2`) on its AVX2 kernels on every CPU that has
  them, AVX-512 parts included: one code path, one rounding.

ATen's own vectorised code is left to pick its ISA: the fixed-order and split-K kernels fix their
reduction orders themselves (the demo's first 12 cases gave the same traces under ATen's AVX2 and
AVX-512 code on an Intel Xeon, measured), and pinning it to AVX2 on a CPU with AMX breaks ATen's own
bf16 attention (its flash kernel packs for AMX, then finds the AVX-512 code switched off).

Only where the CPU has AVX2 (an x86-64 server from 2013 on); a value the user set is kept. What is in
force is read back after torch loads (`in_force`) and recorded with every run; `FLAKECHECK_PIN=0`
turns pinning off (the self-check then judges the libraries as they come).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

PINS = {
    "MKL_CBWR": "AVX2,STRICT",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}
OPT_OUT = "FLAKECHECK_PIN"

_set_by_us: dict[str, str] = {}


def cpu_flags() -> frozenset[str]:
    """The ISA flags /proc/cpuinfo lists for the first CPU (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def wanted() -> dict[str, str]:
    """The settings this machine gets: PINS on an x86-64 CPU with AVX2 unless pinning is turned off."""
    if os.environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off"):
        return {}
    if platform.machine().lower() not in ("x86_64", "amd64") or "avx2" not in cpu_flags():
        return {}
    return dict(PINS)


def pin() -> None:
    """Set every wanted setting the environment does not already give (the user's value wins)."""
    for name, value in wanted().items():
        if name not in os.environ:
            os.environ[name] = value
            _set_by_us[name] = value


def settings() -> dict[str, dict[str, str | None]]:
    """Each pinned variable: the value asked for, the value in the environment, and who set it."""
    asked = wanted()
    return {name: {"wanted": asked.get(name), "environment": os.environ.get(name),
                   "set_by": "flakecheck" if name in _set_by_us else ("user" if name in os.environ else None)}
            for name in PINS}
