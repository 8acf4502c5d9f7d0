"""Which engine a command builds, parsed once at the edge: the model, its dtype, the kernel policy, the
backend, the device profile, the device and the share of a GPU's memory it may take.

The CLI, the Python API and a run directory's meta.json give these as text; `EngineSettings.parse` is the one
place that text becomes a typed value (a UserError, exit 2, naming the option otherwise). Everything below
takes the type: `resolve_engine` (the self-check on this machine), `get_ops`, serve, the Ray actors, explain.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from flakecheck.engine.loader import DEFAULT_MODEL, LoadedModel, load_model
from flakecheck.errors import UserError
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy, parse_policy
from flakecheck.kernels.profiles import DEFAULT_PROFILE, get_profile
from flakecheck.kernels.registry import BACKENDS, DTYPES, backend_for
from flakecheck.machine.device import CPU, Device, profile_of

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default: the weights and the KV cache together, of the whole GPU


def parse_kernels(text: str | KernelPolicy, flag: str = "--kernels") -> KernelPolicy:
    """The policy a setting names (the one parse of a policy's text: the CLI's, the Python API's, meta.json's);
    UserError (exit 2) naming the flag. A KernelPolicy the Python API was given passes as it is."""
    if isinstance(text, KernelPolicy):
        return text
    try:
        return parse_policy(text)
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}") from None


@dataclass(frozen=True)
class EngineSettings:
    model: str = DEFAULT_MODEL  # smollm2 | a Hugging Face directory | FILE.gguf | a hub id
    dtype: str = "bfloat16"
    policy: KernelPolicy = UNIFORM_POLICIES["splitk"]
    backend: str = "auto"  # auto | torch | triton
    profile: str = DEFAULT_PROFILE  # the device profile the split-K heuristics follow
    device: Device = CPU  # resolved: cpu | cuda:N
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # on a GPU: the share weights + KV cache take
    # the backend the kernels run on, resolved once from `backend`, the policy and the device: torch | triton
    kernels_backend: str = field(init=False, compare=False, repr=False)

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
        if not isinstance(self.device, Device):
            raise TypeError(f"EngineSettings.device is a resolved Device (parse text with Device.parse), got "
                            f"{self.device!r}")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {utilization!r}")
        try:
            object.__setattr__(self, "kernels_backend", backend_for(self.policy, self.backend, self.device))
        except ValueError as exc:
            raise UserError(str(exc)) from None

    @classmethod
    def parse(cls, *, model: str = DEFAULT_MODEL, dtype: str = "bfloat16", kernels: str | KernelPolicy = "splitk",
              backend: str = "auto", profile: str = "auto", device: str | Device = "auto",
              gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> EngineSettings:
        """From the options' text (the CLI's, the API's, meta.json's). `device` auto: CUDA when torch sees a
        GPU; `profile` auto: on a GPU its own SM count, on the CPU the default simulated GPU (h100)."""
        policy = parse_kernels(kernels)
        resolved = Device.parse(device)
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
    def from_dict(cls, data: dict[str, Any], device: str | Device | None = None) -> EngineSettings:
        """Settings meta.json recorded; `device` runs them on another device than the recorded one."""
        known = ("model", "dtype", "kernels", "backend", "profile", "device")
        text = {k: str(data[k]) for k in known if data.get(k) is not None}
        if device is not None:
            text["device"] = device
        utilization = data.get("gpu_memory_utilization")
        return cls.parse(**text, gpu_memory_utilization=DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None
                         else float(utilization))


def resolve_profile(profile: str, device: Device) -> str:
    """`auto`: the device's own profile (machine/device.py `profile_of`), else the named one."""
    name = str(profile).strip().lower()
    return profile_of(device) if name == "auto" else name
