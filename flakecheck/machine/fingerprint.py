"""What decides a kernel's bits on this machine, in one comparable value.

The CPU (model, vendor, the ISA flags that select kernels), the libraries (torch, MKL, oneDNN, Triton),
the thread count and the reproducibility settings in force (read back from the libraries, not from the
environment alone). Two machines with equal fingerprints run the same kernels; the self-check's verdicts
are cached under it (flakecheck.machine.selfcheck), and a Ray cluster refuses to mix workers whose
fingerprints differ.

Importable before torch loads (the package imports it before pinning the libraries' settings): torch and
Triton are imported inside the functions that read them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from flakecheck.machine.device import CPU, Device, driver_version
from flakecheck.machine.pinning import PINS, cpu_flags, settings

# The flags that select kernels in MKL, oneDNN, FBGEMM and ATen: their presence is what matters
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "asimd", "sve")
_CBWR_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
                  9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}
_CBWR_STRICT = 0x10000


@dataclass(frozen=True)
class MachineFingerprint:
    device: str  # "cpu", or "cuda:<name> sm_<major><minor>"
    cpu: str  # model name
    vendor: str
    arch: str  # platform.machine()
    isa: tuple[str, ...]  # KERNEL_FLAGS this CPU has
    threads: int  # torch's intra-op threads
    torch: str
    mkl: str | None
    onednn: str | None
    triton: str | None
    mkl_cbwr: str | None  # MKL's reproducibility branch in force, read back from MKL ("AUTO,STRICT")
    aten_capability: str  # the vectorised code ATen runs ("AVX2")
    fbgemm_isa: str | None  # FBGEMM_ENABLE_INSTRUCTIONS (FBGEMM cannot be asked)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def bits_class(self) -> str:
        """What a run's bits follow from beyond the code (measured: not the CPU model, not ATen's ISA, not the
        thread count): the device, MKL's reproducibility branch, FBGEMM's ISA and the library versions. Two
        machines of one class compute the same bits; of two classes, perhaps not."""
        parts = (self.device, f"MKL {self.mkl} {self.mkl_cbwr}", f"FBGEMM {self.fbgemm_isa}", f"torch {self.torch}")
        return "; ".join(parts)

    def describe(self) -> str:
        """One line: the CPU, its widest vector ISA, threads and the pinned settings in force."""
        widest = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "avx", "asimd") if f in self.isa),
                      "baseline")
        pins = ", ".join(f"{k} {v}" for k, v in (("MKL_CBWR", self.mkl_cbwr), ("ATen", self.aten_capability),
                                                   ("FBGEMM", self.fbgemm_isa)) if v)
        where = self.cpu if self.device == "cpu" else f"{self.device} on {self.cpu}"
        return f"{where} ({widest}, {self.threads} threads; {pins or 'nothing pinned'}) [{self.digest}]"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["isa"] = list(self.isa)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineFingerprint:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["isa"] = tuple(values.get("isa") or ())
        return cls(**values)


def current(device: Device = CPU) -> MachineFingerprint:
    """This process's fingerprint (the thread count and settings as they are now)."""
    import torch

    cpu, vendor = _cpu_model()
    flags = cpu_flags()
    where = "cpu"
    if device.is_cuda and torch.cuda.is_available():
        where = gpu_description(device)
    return MachineFingerprint(
        device=where, cpu=cpu, vendor=vendor, arch=platform.machine(),
        isa=tuple(f for f in KERNEL_FLAGS if f in flags), threads=torch.get_num_threads(),
        torch=torch.__version__, mkl=_mkl_version(), onednn=_onednn_version(), triton=_triton_version(),
        mkl_cbwr=mkl_cbwr(), aten_capability=torch.backends.cpu.get_cpu_capability(),
        fbgemm_isa=os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS"),
    )


def gpu_description(device: Device) -> str:
    """What decides a GPU kernel's bits beside the libraries: the GPU, its architecture and SM count (the
    split heuristics read it), the CUDA runtime torch was built with and the driver."""
    import torch

    props = torch.cuda.get_device_properties(device.index)
    return (f"cuda:{props.name} sm_{props.major}{props.minor} {props.multi_processor_count} SMs, CUDA "
            f"{torch.version.cuda}, driver {driver_version() or 'unknown'}")


def in_force() -> dict[str, Any]:
    """The pinned settings as the environment asked for them and as the libraries report them."""
    import torch

    return {"settings": settings(), "mkl_cbwr": mkl_cbwr(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "pins": dict(PINS)}


def mkl_cbwr() -> str | None:
    """MKL's CNR mode in force ("AVX2,STRICT", "AUTO"), None where torch has no MKL symbols to ask."""
    get = _mkl_cbwr_get()
    if get is None:
        return None
    value = int(get(-1))  # MKL_CBWR_ALL
    branch = _CBWR_BRANCHES.get(value & 0xFFFF, str(value & 0xFFFF))
    return f"{branch},STRICT" if value & _CBWR_STRICT else branch


@functools.cache
def _mkl_cbwr_get() -> Any:
    import torch

    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        path = Path(torch.__file__).parent / "lib" / name
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                get = lib.mkl_serv_cbwr_get
            except (OSError, AttributeError):
                return None
            get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
            return get
    return None


def _cpu_model() -> tuple[str, str]:
    model = vendor = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "vendor_id" and not vendor:
                vendor = value.strip()
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), vendor or "unknown"


def _mkl_version() -> str | None:
    import torch

    if not torch.backends.mkl.is_available():
        return None
    for line in torch.__config__.show().splitlines():
        if "Math Kernel Library Version" in line:
            return line.split("Version", 1)[1].split("for")[0].strip()
    return "unknown"


def _onednn_version() -> str | None:
    import torch

    version = getattr(torch.backends.mkldnn, "version", None)
    if callable(version):
        try:
            return ".".join(str(v) for v in version())
        except Exception:  # noqa: BLE001 - an old build without the call: the fingerprint only loses a detail
            return None
    return "available" if torch.backends.mkldnn.is_available() else None


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def flakecheck_version() -> str:
    """The installed flakecheck's version (pyproject.toml is its one source)."""
    try:
        return importlib.metadata.version("flakecheck")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


def software_versions() -> dict[str, str | None]:
    """The versions meta.json records beside the machine: flakecheck, torch, Triton, transformers, Python."""
    import torch
    import transformers

    return {"flakecheck": flakecheck_version(), "torch": torch.__version__, "triton": _triton_version(),
            "transformers": transformers.__version__, "python": platform.python_version()}
