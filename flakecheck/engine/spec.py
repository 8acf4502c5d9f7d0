"""How the engine computes, decided once: the kernel policy, backend, device, profile and dtype, the machine
it runs on and what the self-check verified there.

`resolve_engine` builds it from the typed EngineSettings (a policy the machine cannot honour is refused
here), everything downstream takes it typed (`spec.ops()` builds the kernels on the verified paths,
`spec.simulated` says whether compositions may share forward passes), and meta.json records it once
(`engine`), with the one-line summaries the reports print.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from flakecheck.engine.settings import EngineSettings, parse_kernels
from flakecheck.errors import UserError
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import CHOICES, KernelPaths
from flakecheck.kernels.policy import OP_CLASSES, KernelPolicy
from flakecheck.kernels.registry import get_ops
from flakecheck.kernels.tiles import FP_FUSION
from flakecheck.machine.device import Device
from flakecheck.machine.fingerprint import MachineFingerprint
from flakecheck.machine.invariance_probes import ProbeDims
from flakecheck.machine.selfcheck import Verification, verify


@dataclass(frozen=True)
class EngineSpec:
    policy: KernelPolicy
    backend: str  # resolved: torch | triton
    device: Device
    profile: str
    dtype: str
    verification: Verification

    @property
    def machine(self) -> MachineFingerprint:
        return self.verification.fingerprint

    @property
    def paths(self) -> KernelPaths:
        return self.verification.paths

    @property
    def simulated(self) -> bool:
        """Whether rows of many steps may share a forward pass: the policy has no native op class and the
        machine verified row invariance of every order its plans use."""
        return not self.policy.physical and self.verification.simulated

    def ops(self, also_plans: tuple[KernelPolicy, ...] = ()) -> Ops:
        """The kernels of this spec, on the verified paths (`also_plans`: other policies whose steps the
        same weights must run)."""
        return get_ops(self.policy, self.backend, self.profile, also_plans=also_plans, paths=self.paths)

    def describe(self) -> str:
        return f"kernels {self.policy.name} ({self.backend} on {self.device}, profile {self.profile}, {self.dtype})"

    def to_dict(self) -> dict[str, Any]:
        v = self.verification
        return {
            "policy": self.policy.name, "op_classes": {"matmul": self.policy.matmul,
                                                      "attention": self.policy.attention, "norm": self.policy.norm},
            "backend": self.backend, "device": self.device, "profile": self.profile, "dtype": self.dtype,
            "machine": self.machine.to_dict(), "machine_summary": self.machine.describe(),
            "verification": v.to_dict(), "verification_summary": v.summary(), "simulated": self.simulated,
            # what the Triton kernels' bits follow from beside the machine: the compiler and its FMA contraction
            "triton": ({"version": self.machine.triton, "enable_fp_fusion": FP_FUSION} if self.backend == "triton"
                       else None),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSpec:
        """The spec meta.json's `engine` block records (the policy read by the one parser from its op classes'
        orders, which every version recorded, rather than from its name)."""
        classes = data["op_classes"]
        policy = parse_kernels(",".join(f"{c}={classes[c]}" for c in OP_CLASSES), "engine.op_classes")
        return cls(policy, str(data["backend"]), Device(str(data["device"])),
                   str(data["profile"]), str(data["dtype"]), Verification.from_dict(data["verification"]))


def resolve_engine(settings: EngineSettings, dims: ProbeDims, *, use_cache: bool = True,
                   also: tuple[KernelPolicy, ...] = ()) -> EngineSpec:
    """The spec of an engine on this machine: the self-check run (or read from its cache) for the model's
    shapes. UserError (exit 2) when a fixed-order op class has no path that is invariant here — naming the
    primitive, the failed probe and the machine. `also`: other policies the same kernels will plan steps with
    (explain's one-mechanism variants): each is verified too, and every primitive takes the most conservative
    path any of them needed."""
    policy, dtype, device = settings.policy, getattr(torch, settings.dtype), settings.device
    resolved = settings.kernels_backend
    verification = verify(policy, dims, dtype, settings.profile, use_cache=use_cache, device=device,
                          backend=resolved)
    if verification.refused:
        raise UserError(refusal(policy, verification))
    for other in also:
        extra = verify(other, dims, dtype, settings.profile, use_cache=use_cache, device=device,
                       backend="torch" if other.all_native else resolved)
        if extra.refused:
            raise UserError(refusal(other, extra))
        verification = replace(verification, paths=conservative(verification.paths, extra.paths))
    return EngineSpec(policy, resolved, settings.device, settings.profile, settings.dtype, verification)


def conservative(a: KernelPaths, b: KernelPaths) -> KernelPaths:
    """Each primitive on the later (safer) of two paths."""
    return KernelPaths(**{name: max(getattr(a, name), getattr(b, name), key=choices.index)
                          for name, choices in CHOICES.items()})


def refusal(policy: KernelPolicy, verification: Verification) -> str:
    lines = [f"--kernels {policy.name}: the fixed-order kernels are not batch-invariant on this machine, and no "
             "fallback passed the self-check, so flakecheck will not claim bitwise results here:"]
    for primitive in verification.invariant_failed:
        worst = verification.failure_of(primitive)
        detail = f"{worst.check} differs by up to {worst.max_abs_diff:.3g}" if worst else "no path passed"
        lines.append(f"  {primitive}: {detail}")
    lines.append(f"  machine: {verification.fingerprint.describe()}")
    lines.append("Run `flakecheck kernels check` for every probe; --kernels splitk or native still run here.")
    return "\n".join(lines)

