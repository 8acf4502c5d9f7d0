"""The one registration point: (policy, backend, profile, device) -> an Ops the engine runs on."""

from __future__ import annotations

import torch

from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import FAST, KernelPaths
from flakecheck.kernels.policy import ORDERS, KernelPolicy, parse_policy
from flakecheck.kernels.profiles import get_profile

POLICIES = ORDERS  # the whole-model policies: splitk, invariant, native
BACKENDS = ("auto", "torch", "triton")


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """`auto` means Triton on CUDA and the torch twins on CPU."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return backend


def get_ops(policy: str | KernelPolicy = "native", backend: str = "auto", profile: str = "h100",
            device: torch.device | str = "cpu", fast_cpu_matmuls: bool = True,
            also_plans: tuple[str | KernelPolicy, ...] = (), paths: KernelPaths = FAST) -> Ops:
    """The Ops of a policy (`splitk`, `invariant`, `native` or `matmul=splitk,attention=...`, or parsed);
    `also_plans`: other policies whose steps the same weights must run (one mechanism at a time); `paths`:
    the implementation of each primitive (the machine's self-check chooses them; the torch backend's).
    ValueError naming the choices on a bad policy, backend or profile."""
    parsed = policy if isinstance(policy, KernelPolicy) else parse_policy(policy)
    orders = frozenset((p if isinstance(p, KernelPolicy) else parse_policy(p)).matmul for p in also_plans)
    get_profile(profile)
    resolved = resolve_backend(backend, device)
    if parsed.name == "native":
        resolved = "torch"  # the framework's own kernels: nothing of Triton's
    if resolved == "triton":
        from flakecheck.kernels.triton_backend import TritonBackend

        return Ops(parsed, TritonBackend(), profile, orders)
    from flakecheck.kernels.torch_backend import TorchBackend

    return Ops(parsed, TorchBackend(fast_cpu_matmuls, paths), profile, orders)
