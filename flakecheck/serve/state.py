"""What a running server holds: the model, the one engine loop, and what its answers are stamped with."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field, replace

from flakecheck.engine import LLMEngine, LoadedModel, decode_tokens
from flakecheck.engine.loader import DEFAULT_MODEL
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import DEFAULT_GPU_MEMORY_UTILIZATION, EngineSettings
from flakecheck.engine.spec import EngineSpec, resolve_engine
from flakecheck.errors import UserError
from flakecheck.machine.fingerprint import flakecheck_version
from flakecheck.serve.engine_loop import EngineLoop
from flakecheck.serve.logprobs import TokenTexts
from flakecheck.serve.schemas import model_not_found


@dataclass(frozen=True)
class ServeSettings:
    engine: EngineSettings = EngineSettings()
    max_num_seqs: int = 32
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = False
    max_model_len: int | None = None  # cap the context below the model's (bounds the KV cache)
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        for name, value in (("max-num-seqs", self.max_num_seqs), ("max-num-batched-tokens",
                            self.max_num_batched_tokens), ("max-model-len", self.max_model_len)):
            if value is not None and value < 1:
                raise UserError(f"--{name} must be >= 1, got {value}")

    @classmethod
    def parse(cls, *, model: str = DEFAULT_MODEL, kernels: str = "splitk", dtype: str = "bfloat16",
              profile: str = "auto", device: str = "auto", max_num_seqs: int = 32,
              max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = False,
              max_model_len: int | None = None, served_model_name: str | None = None,
              gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> ServeSettings:
        """From `flakecheck serve`'s options (a bad one is refused before the model loads)."""
        engine = EngineSettings.parse(model=model, dtype=dtype, kernels=kernels, profile=profile, device=device,
                                      gpu_memory_utilization=gpu_memory_utilization)
        return cls(engine, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, max_model_len,
                   served_model_name)


@dataclass
class ServerState:
    settings: ServeSettings
    loaded: LoadedModel
    loop: EngineLoop
    texts: TokenTexts
    tokenizer_lock: threading.Lock
    model_id: str
    max_context: int
    fingerprint: str
    spec: EngineSpec
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, name: str | None) -> None:
        """A request may omit the model; naming another one is a 404, as OpenAI answers."""
        if name is not None and name != self.model_id:
            raise model_not_found(name)


def build_state(settings: ServeSettings, loaded: LoadedModel | None = None) -> ServerState:
    """Load the model (unless given: then its dtype is the server's), build the kernels and the engine; the
    loop is not started yet."""
    engine = settings.engine
    if loaded is None:
        loaded = engine.load()
    else:
        engine = replace(engine, dtype=str(loaded.dtype).removeprefix("torch."))
    # checked on this machine before the first request: a fixed-order server that is not invariant here refuses
    spec = resolve_engine(engine, probe_dims(loaded.config))
    engine = LLMEngine(loaded, spec.ops(), settings.max_num_seqs, settings.max_num_batched_tokens,
                       settings.enable_prefix_caching)
    lock = threading.Lock()

    def decode(ids: list[int]) -> str:
        with lock:
            return decode_tokens(loaded, ids)

    context = loaded.config.max_context
    if settings.max_model_len is not None:
        context = min(context, settings.max_model_len)
    return ServerState(
        settings=settings, loaded=loaded, loop=EngineLoop(engine, decode), texts=TokenTexts(loaded.tokenizer, lock),
        tokenizer_lock=lock, model_id=settings.served_model_name or settings.engine.model, max_context=context,
        fingerprint=system_fingerprint(settings, loaded, spec), spec=spec,
    )


def system_fingerprint(settings: ServeSettings, loaded: LoadedModel, spec: EngineSpec) -> str:
    """Changes whenever the numerics could: the model, its dtype, the kernel policy, backend and profile, the
    machine (its fingerprint) and the kernel paths verified on it."""
    c = loaded.config
    facts = {
        "model": settings.engine.model, "architecture": c.architecture, "layers": c.num_layers, "hidden": c.hidden_size,
        "vocab": c.vocab_size, "dtype": str(loaded.dtype).removeprefix("torch."), "kernels": spec.policy.name,
        "backend": spec.backend, "profile": spec.profile, "flakecheck": flakecheck_version(),
        "machine": spec.machine.digest, "paths": spec.paths.to_dict(),
    }
    return "fp_" + hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:10]
