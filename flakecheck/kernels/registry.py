"""The one registration point: (policy, backend, profile, device) -> an Ops the engine runs on."""

from __future__ import annotations

import os

import torch

from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import FAST, KernelPaths
from flakecheck.kernels.policy import ORDERS, KernelPolicy
from flakecheck.kernels.profiles import get_profile
from flakecheck.kernels.torch_backend import TorchBackend

POLICIES = ORDERS  # the whole-model policies: splitk, invariant, native
BACKENDS = ("auto", "torch", "triton")
DTYPES = ("bfloat16", "float16", "float32")  # the model dtypes: torch's names (getattr(torch, name))


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on `device`: a GPU, or the CPU under TRITON_INTERPRET=1 (slow; for
    tests on small shapes)."""
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """`auto` means Triton on CUDA and the torch twins on CPU. ValueError naming the choices."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    on_gpu = torch.device(device).type == "cuda"
    if backend == "auto":
        return "triton" if on_gpu else "torch"
    if backend == "torch" and on_gpu:
        raise ValueError("the torch twins are CPU kernels (FBGEMM and MKL paths): on a GPU the split-K and "
                         "fixed-order orders run as Triton kernels (use --backend triton or auto), and "
                         "--kernels native runs torch's own CUDA ops")
    if backend == "triton" and not triton_runs_on(device):
        raise ValueError("the Triton kernels run on a GPU (on CPU only under TRITON_INTERPRET=1, slow; meant for "
                         "small tests): use --backend torch or auto here")
    return backend


def get_ops(policy: KernelPolicy, backend: str = "auto", profile: str = "h100",
            device: torch.device | str = "cpu", fast_cpu_matmuls: bool = True,
            also_plans: tuple[KernelPolicy, ...] = (), paths: KernelPaths = FAST) -> Ops:
    """The Ops of a policy; `also_plans`: other policies whose steps the same weights must run (one mechanism
    at a time); `paths`: the implementation of each primitive (the machine's self-check chooses them; the
    torch backend's). ValueError naming the choices on a bad backend or profile."""
    get_profile(profile)
    resolved = "torch" if policy.name == "native" else resolve_backend(backend, device)  # native: no Triton
    orders = frozenset(p.matmul for p in also_plans)
    if resolved == "triton":
        from flakecheck.kernels.triton_backend import TritonBackend  # imports triton, absent on some machines

        return Ops(policy, TritonBackend(), profile, orders)
    return Ops(policy, TorchBackend(fast_cpu_matmuls, paths), profile, orders)
