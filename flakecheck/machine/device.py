"""The device an engine runs on, named once: `auto`, `cpu` or `cuda[:N]` become `cpu` or `cuda:N`, and what
the device itself tells (its SM count, its free memory) is read here and nowhere else.

torch is imported inside the functions: the engine's settings import this module, and commands that load no
model (report, gate) must not pay for torch.
"""

from __future__ import annotations

import re
import resource
import sys

from flakecheck.errors import UserError

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_device(text: str, flag: str = "--device") -> str:
    """`cpu` or `cuda:N` for a device's name; `auto` is CUDA when torch sees a GPU, else the CPU. UserError
    (exit 2) naming the flag for a name it does not know or a GPU this machine does not have."""
    import torch

    name = str(text).strip().lower()
    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    match = _CUDA.fullmatch(name)
    if match is None:
        raise UserError(f"{flag} {text!r}: choose {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise UserError(f"{flag} {text}: no CUDA device is visible here ({build}); use --device cpu, or install a "
                        "CUDA build of torch on a machine with an NVIDIA GPU")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(f"{flag} {text}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return f"cuda:{index}"


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def device_sms(device: str) -> int | None:
    """The GPU's streaming multiprocessors; None on the CPU."""
    if not is_cuda(device):
        return None
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def device_name(device: str) -> str:
    if not is_cuda(device):
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name(device))


def memory_info(device: str) -> tuple[int, int] | None:
    """(free, total) bytes of the GPU's memory as the driver reports them; None on the CPU."""
    if not is_cuda(device):
        return None
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def driver_version() -> str | None:
    """The CUDA driver's version ("12.4"), or None where torch cannot say."""
    import torch

    try:
        raw = int(torch._C._cuda_getDriverVersion())  # the driver API's cuDriverGetVersion: 12040 -> 12.4
    except (AttributeError, RuntimeError):
        return None
    return f"{raw // 1000}.{raw % 1000 // 10}"


def peak_device_bytes(device: str) -> int | None:
    """The most memory torch's allocator held on the GPU in this process; None on the CPU."""
    if not is_cuda(device):
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(device))


def peak_memory(device: str) -> dict[str, int | None]:
    """This process's peak resident host memory and, on a GPU, the peak its allocator held there (bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    host = rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux
    return {"peak_host_bytes": int(host), "peak_device_bytes": peak_device_bytes(device)}
