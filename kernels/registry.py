"""The one registration point: (policy, backend, profile, device) -> an Ops the engine runs on."""

from __future__ import annotations

import torch
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.profiles import PROFILES, get_profile

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
    """The policy's Ops. `native` is always the framework's own kernels (backend torch)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown kernel policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if (profile or "h100").lower() not in PROFILES:
        get_profile(profile)  # raises the ValueError naming the choices
    resolved = resolve_backend(backend, device)
    if policy == "native":
        ops = Ops(profile)
        ops.backend = "torch"
        return ops
    if resolved == "triton":
        from flakecheck.kernels.triton_ops import InvariantTritonOps, SplitKTritonOps

        return (InvariantTritonOps if policy == "invariant" else SplitKTritonOps)(profile)
    from flakecheck.kernels.invariant import InvariantTorchOps
    from flakecheck.kernels.splitk import SplitKTorchOps

    return (InvariantTorchOps if policy == "invariant" else SplitKTorchOps)(profile)
