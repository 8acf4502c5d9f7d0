"""Which engine a command builds, parsed once at the edge: the model, its dtype, the kernel policy, the
backend, the device profile and the device.

The CLI, the Python API and a run directory's meta.json give these as text; `EngineSettings.parse` is the one
place that text becomes a typed value (a UserError, exit 2, naming the option otherwise). Everything below
takes the type: `resolve_engine` (the self-check on this machine), `get_ops`, serve, the Ray actors, explain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flakecheck.engine.loader import DEFAULT_MODEL
from flakecheck.errors import UserError
from flakecheck.kernels.policy import KernelPolicy, parse_policy
from flakecheck.kernels.profiles import PROFILES
from flakecheck.kernels.registry import BACKENDS, DTYPES, resolve_backend


def parse_kernels(text: str, flag: str = "--kernels") -> KernelPolicy:
    """The policy a setting names; UserError (exit 2) naming the flag."""
    try:
        return parse_policy(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


@dataclass(frozen=True)
class EngineSettings:
    model: str = DEFAULT_MODEL  # smollm2 | a Hugging Face directory | FILE.gguf | a hub id
    dtype: str = "bfloat16"
    policy: KernelPolicy = KernelPolicy.of("splitk")
    backend: str = "auto"  # auto | torch | triton
    profile: str = "h100"  # the device profile the split-K heuristics follow
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.policy, KernelPolicy):
            raise TypeError(f"EngineSettings.policy is a KernelPolicy (parse text with parse_kernels), got "
                            f"{self.policy!r}")
        object.__setattr__(self, "profile", self.profile.lower())
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.profile not in PROFILES:
            raise UserError(f"unknown device profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.policy.name != "native":  # native runs the framework's own kernels, whatever the backend
            try:
                resolve_backend(self.backend, self.device)
            except ValueError as exc:
                raise UserError(str(exc)) from None

    @classmethod
    def parse(cls, *, model: str = DEFAULT_MODEL, dtype: str = "bfloat16", kernels: str = "splitk",
              backend: str = "auto", profile: str = "h100", device: str = "cpu") -> EngineSettings:
        """From the options' text (the CLI's, the API's, meta.json's)."""
        policy = parse_kernels(kernels)
        return cls(model=model, dtype=dtype, policy=policy, backend=backend, profile=profile, device=device)

    def with_policy(self, policy: KernelPolicy) -> EngineSettings:
        return replace(self, policy=policy)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "dtype": self.dtype, "kernels": self.policy.name, "backend": self.backend,
                "profile": self.profile, "device": self.device}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSettings:
        known = ("model", "dtype", "kernels", "backend", "profile", "device")
        return cls.parse(**{k: str(data[k]) for k in known if data.get(k) is not None})
