"""How the engine computes, decided once: the kernel policy, backend, device, profile and dtype, the machine
it runs on and what the self-check verified there.

`resolve_engine` builds it from the user's settings (every check in one place: a bad policy, backend or
profile, a policy the machine cannot honour), everything downstream takes it typed (`spec.ops()` builds
the kernels on the verified paths, `spec.simulated` says whether compositions may share forward passes),
meta.json records it once (`engine`), and reports read it back with `EngineSpec.from_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flakecheck.errors import UserError
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.paths import KernelPaths
from flakecheck.kernels.policy import KernelPolicy, parse_policy
from flakecheck.kernels.profiles import PROFILES
from flakecheck.machine.fingerprint import MachineFingerprint
from flakecheck.machine.probes import ProbeDims
from flakecheck.machine.selfcheck import Verification

BACKENDS = ("auto", "torch", "triton")
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class EngineSpec:
    policy: KernelPolicy
    backend: str  # resolved: torch | triton
    device: str  # cpu | cuda
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
        from flakecheck.kernels.registry import get_ops

        return get_ops(self.policy, self.backend, self.profile, self.device, also_plans=also_plans, paths=self.paths)

    def describe(self) -> str:
        return f"kernels {self.policy.name} ({self.backend} on {self.device}, profile {self.profile}, {self.dtype})"

    def to_dict(self) -> dict[str, Any]:
        v = self.verification
        return {
            "policy": self.policy.name, "op_classes": {"matmul": self.policy.matmul,
                                                      "attention": self.policy.attention, "norm": self.policy.norm},
            "backend": self.backend, "device": self.device, "profile": self.profile, "dtype": self.dtype,
            "machine": self.machine.to_dict(), "machine_summary": self.machine.describe(),
            "verification": v.to_dict(), "simulated": self.simulated,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSpec:
        return cls(parse_policy(str(data["policy"])), str(data["backend"]), str(data["device"]),
                   str(data["profile"]), str(data["dtype"]), Verification.from_dict(data["verification"]))


def parse_kernels(kernels: str | KernelPolicy, flag: str = "--kernels") -> KernelPolicy:
    """The policy of a setting; UserError (exit 2) naming the flag."""
    if isinstance(kernels, KernelPolicy):
        return kernels
    try:
        return parse_policy(kernels)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


def check_settings(backend: str, profile: str, dtype: str) -> None:
    """UserError (exit 2) naming the first bad setting."""
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if profile.lower() not in PROFILES:
        raise UserError(f"unknown device profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")


def resolve_engine(kernels: str | KernelPolicy, dims: ProbeDims, *, backend: str = "auto", profile: str = "h100",
                   dtype: str = "bfloat16", device: str = "cpu", use_cache: bool = True,
                   also: tuple[KernelPolicy, ...] = ()) -> EngineSpec:
    """The spec of an engine on this machine: settings checked, the self-check run (or read from its cache)
    for the model's shapes. UserError (exit 2) when a fixed-order op class has no path that is invariant
    here — naming the primitive, the failed probe and the machine. `also`: other policies the same kernels
    will plan steps with (explain's one-mechanism variants): each is verified too, and every primitive takes
    the most conservative path any of them needed."""
    import torch

    from flakecheck.kernels.registry import resolve_backend
    from flakecheck.machine.selfcheck import verify

    policy = parse_kernels(kernels)
    check_settings(backend, profile, dtype)
    resolved = "torch" if policy.name == "native" else resolve_backend(backend, device)
    if resolved == "triton" and device == "cpu":
        raise UserError("the Triton kernels run on a GPU (on CPU only under TRITON_INTERPRET=1, slow; meant for "
                        "small tests): use --backend torch or auto here")
    verification = verify(policy, dims, getattr(torch, dtype), profile.lower(), use_cache=use_cache)
    if verification.refused:
        raise UserError(refusal(policy, verification))
    for other in also:
        extra = verify(other, dims, getattr(torch, dtype), profile.lower(), use_cache=use_cache)
        if extra.refused:
            raise UserError(refusal(other, extra))
        verification = replace(verification, paths=conservative(verification.paths, extra.paths))
    return EngineSpec(policy, resolved, device, profile.lower(), dtype, verification)


def conservative(a: KernelPaths, b: KernelPaths) -> KernelPaths:
    """Each primitive on the later (safer) of two paths."""
    from flakecheck.kernels.paths import CHOICES

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

