"""The engine: requests in, one ragged forward pass per step, completions with top-2 logprobs out."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flakecheck.engine.engine_core import EngineCore, EngineStats, Request
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.loader import LoadedModel
from flakecheck.engine.model_runner import ModelRunner
from flakecheck.engine.models import CausalLM
from flakecheck.engine.models import build_model as build_network
from flakecheck.engine.prefix_cache import PrefixCache
from flakecheck.engine.sequence import Completion
from flakecheck.kernels import Ops, get_ops
from flakecheck.kernels.policy import UNIFORM_POLICIES
from flakecheck.kernels.tensor_parallel import NONE, TensorParallel

__all__ = ["EngineStats", "Knobs", "LLMEngine", "Request", "build_model", "decode_tokens", "encode_prompt", "kv_cache",
           "token_texts"]


@dataclass(frozen=True)
class Knobs:
    """The scheduling knobs a replay sets on the engine for one composition (each composition axis declares the
    knobs it sets: flakecheck/data/axes/); equal knobs schedule and plan a sequence's steps alike."""

    max_num_seqs: int = 1
    max_num_batched_tokens: int | None = None  # a step's prefill budget (None: whole prompts)
    enable_prefix_caching: bool = False
    tp_size: int = 1  # tensor-parallel ranks
    allreduce: str = NONE  # how they sum (NONE at one rank)

    @property
    def tensor_parallel(self) -> TensorParallel:
        return TensorParallel(self.tp_size, self.allreduce)


def build_model(model: LoadedModel, ops: Ops) -> CausalLM:
    """The model's layers over the loaded weights, with what `ops`' policy derives from them."""
    return build_network(model.config, model.weights, ops, model.config.max_context)


def kv_cache(model: LoadedModel, num_slots: int, length: int = 256) -> KVCache:
    """A KV cache for `model` on its device, within what its GPU leaves for one (no bound on the CPU)."""
    c = model.config
    return KVCache(c.num_layers, num_slots, c.num_kv_heads, c.head_dim, model.dtype, length, model.device,
                   model.kv_budget_bytes)


class LLMEngine:
    """One engine core (scheduler, sequences, KV slots, prefix cache) and the model runner it steps."""

    def __init__(self, model: LoadedModel, ops: Ops | None = None, max_num_seqs: int = 1,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = False,
                 network: CausalLM | None = None) -> None:
        self.loaded = model
        self.model = network if network is not None else build_model(model, ops or get_ops(UNIFORM_POLICIES["native"]))
        self.ops = self.model.ops
        self.cache = kv_cache(model, max_num_seqs)
        self.runner = ModelRunner(self.model, self.cache)
        self.eos_token_ids = model.eos_token_ids
        self.core: EngineCore | None = None
        self.tp = TensorParallel()
        self.reconfigure(max_num_seqs, max_num_batched_tokens, enable_prefix_caching)
        if network is None:
            self._warm_up()

    def _warm_up(self) -> None:
        """One tiny forward at load time: first-use costs (allocator, thread pools) are not paid by
        the first request."""
        self.runner.prompt_logprobs([0, 0])

    def reconfigure(self, max_num_seqs: int, max_num_batched_tokens: int | None = None,
                    enable_prefix_caching: bool = False, tp: TensorParallel = TensorParallel()) -> None:
        """New scheduling limits (and tensor parallelism) for the next requests; weights and derived kernels
        are kept."""
        if self.has_unfinished():
            raise RuntimeError("reconfigure() with requests still in flight")
        if max_num_seqs != self.cache.shape[0]:
            self.cache = kv_cache(self.loaded, max_num_seqs)
            self.runner = ModelRunner(self.model, self.cache)
        config = self.loaded.config
        self.tp = tp
        self.core = EngineCore(self.cache, self.eos_token_ids, config.max_context, max_num_seqs,
                               max_num_batched_tokens, PrefixCache() if enable_prefix_caching else None)

    def configure(self, knobs: Knobs) -> None:
        """reconfigure() with a composition's knobs."""
        self.reconfigure(knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.enable_prefix_caching,
                         knobs.tensor_parallel)

    @property
    def stats(self) -> EngineStats:
        assert self.core is not None
        return self.core.stats

    @property
    def clock(self) -> int:
        assert self.core is not None
        return self.core.clock

    def has_unfinished(self) -> bool:
        return self.core is not None and self.core.has_unfinished()

    def add_request(self, request: Request) -> None:
        assert self.core is not None
        self.core.eos_token_ids = self.eos_token_ids
        self.core.add_request(request, "context")

    def step(self) -> list[Completion]:
        """Run one forward pass over every scheduled sequence; return the ones that finished."""
        assert self.core is not None
        self.core.eos_token_ids = self.eos_token_ids
        scheduled = self.core.propose()
        if not scheduled:
            return []
        step = self.runner.plan(scheduled, tp=self.tp)
        return self.core.commit(scheduled, self.runner.run([step])[0])

    def progress(self, request_id: Any) -> Completion | None:
        assert self.core is not None
        return self.core.progress(request_id)

    def abort(self, request_id: Any, reason: str = "abort") -> Completion | None:
        assert self.core is not None
        return self.core.abort(request_id, reason)

    def generate(self, requests: Iterable[Request],
                 on_finish: Callable[[Completion], None] | None = None) -> list[Completion]:
        """Run requests to completion through the scheduler; completions come back in request order."""
        order = []
        for request in requests:
            self.add_request(request)
            order.append(request.request_id)
        done: dict[Any, Completion] = {}
        while self.has_unfinished():
            for completion in self.step():
                done[completion.request_id] = completion
                if on_finish is not None:
                    on_finish(completion)
        return [done[rid] for rid in order]


def encode_prompt(model: LoadedModel, prompt: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a raw completion prompt (str) or of chat messages through the chat template."""
    tok = model.tokenizer
    if isinstance(prompt, str):
        return list(tok(prompt, add_special_tokens=True)["input_ids"])
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def decode_tokens(model: LoadedModel, token_ids: list[int]) -> str:
    return model.tokenizer.decode(token_ids, skip_special_tokens=True)


def token_texts(model: LoadedModel) -> Callable[[int], str]:
    """One token id -> its text, decoded once per id."""
    texts: dict[int, str] = {}

    def token_text(token_id: int) -> str:
        if token_id not in texts:
            texts[token_id] = model.tokenizer.decode([token_id])
        return texts[token_id]

    return token_text


