"""The one registration point: (policy, backend, profile, device) -> an Ops the engine runs on."""

from __future__ import annotations

import torch

from flakecheck.kernels.ops import Ops

POLICIES = ("native", "splitk", "invariant")
BACKENDS = ("auto", "torch", "triton")


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """`auto` means Triton on CUDA and the torch twins on CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return backend


def get_ops(policy: str = "native", backend: str = "auto", profile: str = "h100",
            device: torch.device | str = "cpu") -> Ops:
    if policy not in POLICIES:
        raise ValueError(f"unknown kernel policy {policy!r}; choose one of {', '.join(POLICIES)}")
    resolved = resolve_backend(backend, device)
    if policy == "native":
        ops = Ops(profile)
        ops.backend = "torch"
        return ops
    raise NotImplementedError(f"kernel policy {policy!r} ({resolved}) is not built yet")
