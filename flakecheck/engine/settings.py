"""Which engine a command builds, parsed once at the edge: the model, its dtype, the kernel policy, the
backend, the device profile, the device and the share of a GPU's memory it may take.

The CLI, the Python API and a run directory's meta.json give these as text; `EngineSettings.parse` is the one
place that text becomes a typed value (a UserError, exit 2, naming the option otherwise). Everything below
takes the type: `resolve_engine` (the self-check on this machine), `get_ops`, serve, the Ray actors, explain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flakecheck.engine.loader import DEFAULT_MODEL, LoadedModel, load_model
from flakecheck.errors import UserError
from flakecheck.kernels.policy import KernelPolicy, parse_policy
from flakecheck.kernels.profiles import DEFAULT_PROFILE, get_profile, profile_for_sms
from flakecheck.kernels.registry import BACKENDS, DTYPES, resolve_backend
from flakecheck.machine.device import device_sms, resolve_device

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default: the weights and the KV cache together, of the whole GPU


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
    profile: str = DEFAULT_PROFILE  # the device profile the split-K heuristics follow
    device: str = "cpu"  # resolved: cpu | cuda:N
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # on a GPU: the share weights + KV cache take

    def __post_init__(self) -> None:
        if not isinstance(self.policy, KernelPolicy):
            raise TypeError(f"EngineSettings.policy is a KernelPolicy (parse text with parse_kernels), got "
                            f"{self.policy!r}")
        object.__setattr__(self, "profile", self.profile.lower())
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        try:
            get_profile(self.profile)
        except ValueError as exc:
            raise UserError(f"--profile: {exc}") from None
        if self.device != "cpu" and not self.device.startswith("cuda:"):
            raise TypeError(f"EngineSettings.device is resolved (cpu or cuda:N; parse text with resolve_device), "
                            f"got {self.device!r}")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {utilization!r}")
        if self.policy.name != "native":  # native runs the framework's own kernels, whatever the backend
            try:
                resolve_backend(self.backend, self.device)
            except ValueError as exc:
                raise UserError(str(exc)) from None

    @classmethod
    def parse(cls, *, model: str = DEFAULT_MODEL, dtype: str = "bfloat16", kernels: str = "splitk",
              backend: str = "auto", profile: str = "auto", device: str = "auto",
              gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> EngineSettings:
        """From the options' text (the CLI's, the API's, meta.json's). `device` auto: CUDA when torch sees a
        GPU; `profile` auto: on a GPU its own SM count, on the CPU the default simulated GPU (h100)."""
        policy = parse_kernels(kernels)
        resolved = resolve_device(device)
        return cls(model=model, dtype=dtype, policy=policy, backend=backend,
                   profile=resolve_profile(profile, resolved), device=resolved,
                   gpu_memory_utilization=gpu_memory_utilization)

    def load(self) -> LoadedModel:
        """The model, its weights on the device in the dtype (exit 2 when they do not fit there)."""
        return load_model(self.model, self.dtype, self.device, self.gpu_memory_utilization)

    def with_policy(self, policy: KernelPolicy) -> EngineSettings:
        return replace(self, policy=policy)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "dtype": self.dtype, "kernels": self.policy.name, "backend": self.backend,
                "profile": self.profile, "device": self.device,
                "gpu_memory_utilization": self.gpu_memory_utilization}

    @classmethod
    def from_dict(cls, data: dict[str, Any], device: str | None = None) -> EngineSettings:
        """Settings meta.json recorded; `device` runs them on another device than the recorded one."""
        known = ("model", "dtype", "kernels", "backend", "profile", "device")
        text = {k: str(data[k]) for k in known if data.get(k) is not None}
        if device is not None:
            text["device"] = device
        utilization = data.get("gpu_memory_utilization")
        return cls.parse(**text, gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None
                         else float(utilization))


def resolve_profile(profile: str, device: str) -> str:
    """`auto`: a GPU's own SM count (a named profile when one has it), the default simulated GPU on the CPU."""
    if str(profile).strip().lower() != "auto":
        return str(profile).strip().lower()
    sms = device_sms(device)
    return profile_for_sms(sms) if sms is not None else DEFAULT_PROFILE
