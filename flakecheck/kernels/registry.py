"""The one registration point: (policy, backend, profile, device) -> an Ops the engine runs on."""

from __future__ import annotations

import os
from typing import Protocol

from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import FAST, KernelPaths
from flakecheck.kernels.policy import ORDERS, KernelPolicy
from flakecheck.kernels.profiles import get_profile
from flakecheck.kernels.torch_backend import TorchBackend


class OnDevice(Protocol):
    """A resolved flakecheck Device (flakecheck/machine/device.py, a layer above) or the torch.device a tensor
    carries: both say their `type`, `cpu` or `cuda`."""

    @property
    def type(self) -> str: ...


POLICIES = ORDERS  # the whole-model policies: splitk, invariant, native
BACKENDS = ("auto", "torch", "triton")
RESOLVED_BACKENDS = ("torch", "triton")  # what `auto` becomes on a device
DTYPES = ("bfloat16", "float16", "float32")  # the model dtypes: torch's names (getattr(torch, name))


def _on_gpu(device: OnDevice | None) -> bool:
    return device is not None and device.type == "cuda"  # None: the CPU


def triton_runs_on(device: OnDevice | None) -> bool:
    """Whether the Triton kernels can run on `device`: a GPU, or the CPU under TRITON_INTERPRET=1 (slow; for
    tests on small shapes)."""
    return _on_gpu(device) or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_backend(backend: str, device: OnDevice | None) -> str:
    """`auto` means Triton on CUDA and the torch twins on CPU. ValueError naming the choices. `device`: a
    resolved Device (flakecheck/machine/device.py) or the torch.device a tensor carries; both say `.type`."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    on_gpu = _on_gpu(device)
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


def backend_for(policy: KernelPolicy, backend: str, device: OnDevice | None) -> str:
    """The backend a policy's kernels run on: `torch` for all-native (the framework's own ops, no Triton),
    else `backend` resolved for the device."""
    return "torch" if policy.all_native else resolve_backend(backend, device)


def get_ops(policy: KernelPolicy, backend: str = "torch", profile: str = "h100", fast_cpu_matmuls: bool = True,
            also_plans: tuple[KernelPolicy, ...] = (), paths: KernelPaths = FAST) -> Ops:
    """The Ops of a policy on a backend already resolved for the device (`backend_for`, once per engine: torch
    or triton); `also_plans`: other policies whose steps the same weights must run (one mechanism at a time);
    `paths`: the implementation of each primitive (the machine's self-check chooses them; the torch backend's).
    ValueError on a bad profile or an unresolved backend."""
    get_profile(profile)
    if backend not in RESOLVED_BACKENDS:
        raise ValueError(f"get_ops takes a resolved backend ({' or '.join(RESOLVED_BACKENDS)}; backend_for "
                         f"resolves `auto` for a device), got {backend!r}")
    orders = frozenset(o for p in also_plans for o in p.matmul_orders)
    if backend == "triton":
        from flakecheck.kernels.triton_backend import TritonBackend  # imports triton, absent on some machines

        return Ops(policy, TritonBackend(), profile, orders)
    return Ops(policy, TorchBackend(fast_cpu_matmuls, paths), profile, orders)
