"""Injected faults, for tests of the self-check: `FLAKECHECK_FAULT=primitive:path[,...]` makes that kernel
path behave as MKL's GEMM did on an AVX-512 Xeon — a row's bits depend on the batch it is computed in (here:
the first row of every call with an odd row count moves). Nothing else reads it; unset, nothing changes.
"""

from __future__ import annotations

import functools
import os

import torch

ENV = "FLAKECHECK_FAULT"


@functools.cache
def _parse(text: str) -> frozenset[tuple[str, str]]:
    faults = set()
    for part in text.split(","):
        primitive, sep, path = part.strip().partition(":")
        if sep:
            faults.add((primitive.strip(), path.strip()))
    return frozenset(faults)


def active() -> frozenset[tuple[str, str]]:
    return _parse(os.environ.get(ENV, ""))


def injected(primitive: str, path: str) -> bool:
    return (primitive, path) in active()


def perturb(out: torch.Tensor, rows: int) -> torch.Tensor:
    """out with its first row moved when the call held an odd number of rows."""
    if rows % 2 == 0 or out.shape[0] == 0:
        return out
    out = out.clone()
    out[0] = out[0] * 1.0625 + 1e-3
    return out
