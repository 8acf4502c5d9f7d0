"""The device an engine runs on, named once: `auto`, `cpu` or `cuda[:N]` become `cpu` or `cuda:N`, and what
the device itself tells (its SM count, its free memory) is read here and nowhere else.

torch is imported inside the functions: the engine's settings import this module, and commands that load no
model (report, gate) must not pay for torch.
"""

from __future__ import annotations

import re
import resource
import sys
from typing import Any

from flakecheck.errors import UserError

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
_CUDA = re.compile(r"cuda(?::(\d+))?")
_RESOLVED = re.compile(r"cpu|cuda:\d+")


class DeviceError(UserError):
    """A device a setting names that this machine cannot run on (unknown name, no GPU, too few GPUs)."""


class Device(str):
    """A resolved device: `cpu` or `cuda:N`. Made from text once where text enters (`Device.parse`); below, code
    asks it (`is_cuda`, `index`, `torch()`) instead of reading the string again. It is a str so that meta.json,
    the run record and the fingerprint write it as its name, and `Device("cpu") == "cpu"`."""

    def __new__(cls, name: str) -> Device:
        if not _RESOLVED.fullmatch(str(name)):
            raise ValueError(f"a resolved device is cpu or cuda:N (parse text with Device.parse), got {name!r}")
        return super().__new__(cls, name)

    @classmethod
    def parse(cls, text: str, flag: str = "--device") -> Device:
        return resolve_device(text, flag)

    @property
    def is_cuda(self) -> bool:
        return self != "cpu"

    @property
    def type(self) -> str:
        """`cpu` or `cuda`, as a torch.device's `type` says it (so code given either asks the same)."""
        return "cuda" if self.is_cuda else "cpu"

    @property
    def index(self) -> int | None:
        """The GPU's index (cuda:N's N); None on the CPU."""
        return int(self.partition(":")[2]) if self.is_cuda else None

    def torch(self) -> Any:
        """This device as torch names it (a torch.device)."""
        import torch

        return torch.device(str(self))


CPU = Device("cpu")


def resolve_device(text: str, flag: str = "--device") -> Device:
    """`cpu` or `cuda:N` for a device's name; `auto` is CUDA when torch sees a GPU, else the CPU. DeviceError
    (a UserError, exit 2) naming the flag for a name it does not know or a GPU this machine does not have."""
    import torch

    if isinstance(text, Device):
        return text
    name = str(text).strip().lower()
    if name == "auto":
        return Device("cuda:0") if torch.cuda.is_available() else CPU
    if name == "cpu":
        return CPU
    match = _CUDA.fullmatch(name)
    if match is None:
        raise DeviceError(f"{flag} {text!r}: choose {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise DeviceError(f"{flag} {text}: no CUDA device is visible here ({build}); use --device cpu, or install "
                          "a CUDA build of torch on a machine with an NVIDIA GPU")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"{flag} {text}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return Device(f"cuda:{index}")


def profile_of(device: Device) -> str:
    """The device profile `--profile auto` means: a GPU's own SM count (a named profile when one has it), the
    default simulated GPU on the CPU."""
    from flakecheck.kernels.profiles import DEFAULT_PROFILE, profile_for_sms

    sms = device_sms(device)
    return profile_for_sms(sms) if sms is not None else DEFAULT_PROFILE


def device_sms(device: Device) -> int | None:
    """The GPU's streaming multiprocessors; None on the CPU."""
    if not device.is_cuda:
        return None
    import torch

    return int(torch.cuda.get_device_properties(device.index).multi_processor_count)


def device_name(device: Device) -> str:
    if not device.is_cuda:
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name(device.index))


def memory_info(device: Device) -> tuple[int, int] | None:
    """(free, total) bytes of the GPU's memory as the driver reports them; None on the CPU."""
    if not device.is_cuda:
        return None
    import torch

    free, total = torch.cuda.mem_get_info(device.index)
    return int(free), int(total)


def driver_version() -> str | None:
    """The CUDA driver's version ("12.4"), or None where torch cannot say."""
    import torch

    try:
        raw = int(torch._C._cuda_getDriverVersion())  # the driver API's cuDriverGetVersion: 12040 -> 12.4
    except (AttributeError, RuntimeError):
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"


def peak_device_bytes(device: Device) -> int | None:
    """The most memory torch's allocator held on the GPU in this process; None on the CPU."""
    if not device.is_cuda:
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(device.index))


def peak_memory(device: Device) -> dict[str, int | None]:
    """This process's peak resident host memory and, on a GPU, the peak its allocator held there (bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    host = rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux
    return {"peak_host_bytes": int(host), "peak_device_bytes": peak_device_bytes(device)}
