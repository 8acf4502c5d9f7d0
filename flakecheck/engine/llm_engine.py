"""The engine: requests in, one ragged forward pass per step, completions with top-2 logprobs out."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.loader import LoadedModel
from flakecheck.engine.model_runner import ModelRunner
from flakecheck.engine.models import MODEL_CLASSES
from flakecheck.engine.prefix_cache import PrefixCache
from flakecheck.engine.sampler import greedy_top2
from flakecheck.engine.scheduler import Scheduler
from flakecheck.engine.sequence import Completion, SamplingParams, SeqStatus, Sequence
from flakecheck.kernels import Ops, get_ops


@dataclass(frozen=True)
class Request:
    request_id: Any
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    arrival: int = 0  # engine step at which the request may first be scheduled
    cache_salt: str | None = None  # requests with different salts never share prefix-cache blocks


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    last_step_seqs: int = 0  # sequences in the last step's forward pass (decodes and prefill chunks)


class LLMEngine:
    def __init__(self, model: LoadedModel, ops: Ops | None = None, max_num_seqs: int = 1,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = False) -> None:
        self.loaded, self.ops = model, ops or get_ops("native")
        config = model.config
        model_cls = MODEL_CLASSES[config.architecture]
        self.model = model_cls(config, model.weights, self.ops, config.max_context)
        self.max_num_seqs = max_num_seqs
        self.cache = KVCache(config.num_layers, max_num_seqs, config.num_kv_heads, config.head_dim, model.dtype)
        self.runner = ModelRunner(self.model, self.cache)
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        self.eos_token_ids = model.eos_token_ids
        self.reconfigure(max_num_seqs, max_num_batched_tokens, enable_prefix_caching)
        self._warm_up()

    def _warm_up(self) -> None:
        """One tiny forward at load time, so that what a policy derives from the weights on first
        use (e.g. fp32 copies for its GEMMs) is not paid by the first request."""
        self.runner.prompt_logprobs([0, 0])

    def reconfigure(self, max_num_seqs: int, max_num_batched_tokens: int | None = None,
                    enable_prefix_caching: bool = False) -> None:
        """New scheduling limits for the next requests; weights and derived kernels are kept."""
        if self.has_unfinished():
            raise RuntimeError("reconfigure() with requests still in flight")
        if max_num_seqs != self.cache.shape[0]:
            c = self.loaded.config
            self.cache = KVCache(c.num_layers, max_num_seqs, c.num_kv_heads, c.head_dim, self.loaded.dtype)
            self.runner = ModelRunner(self.model, self.cache)
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens, on_admit=self._admit)
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        self.clock = 0
        self.stats = EngineStats()

    def has_unfinished(self) -> bool:
        return hasattr(self, "scheduler") and self.scheduler.has_unfinished()

    def add_request(self, request: Request) -> None:
        config = self.loaded.config
        seq = Sequence(request.request_id, list(request.prompt_ids), request.params, request.arrival,
                       request.cache_salt)
        if seq.max_length > config.max_context:
            what = "sliding window" if config.max_context != config.max_position_embeddings else "context"
            raise ValueError(
                f"request {request.request_id!r}: {seq.num_prompt} prompt + {request.params.max_tokens} new "
                f"tokens exceed the model's {what} of {config.max_context}"
            )
        self.scheduler.add(seq)

    def _admit(self, seq: Sequence) -> None:
        seq.slot = self.cache.allocate()
        self.cache.ensure_length(seq.max_length)
        self.stats.prompt_tokens += seq.num_prompt
        if self.prefix_cache is not None:
            blocks = self.prefix_cache.lookup(seq.prompt_ids, seq.cache_salt)
            for i, block in enumerate(blocks):
                self.cache.load(seq.slot, i * self.prefix_cache.block_size, block)
            seq.num_computed = seq.cached_prompt_tokens = len(blocks) * self.prefix_cache.block_size
            self.stats.prefix_hit_tokens += seq.cached_prompt_tokens

    def _remember_prefix(self, seq: Sequence) -> None:
        size = self.prefix_cache.block_size
        for index, key in self.prefix_cache.missing(seq.prompt_ids, seq.cache_salt):
            self.prefix_cache.insert(key, self.cache.read(seq.slot, index * size, (index + 1) * size))

    def step(self) -> list[Completion]:
        """Run one forward pass over every scheduled sequence; return the ones that finished."""
        scheduled = self.scheduler.schedule(self.clock)
        if not scheduled:
            arrival = self.scheduler.next_arrival()
            if arrival is None:
                return []
            self.clock = max(self.clock, arrival)  # nothing running: skip ahead to the next arrival
            scheduled = self.scheduler.schedule(self.clock)
        logprobs, sampling = self.runner.run(scheduled)
        self.clock += 1
        self.stats.steps += 1
        self.stats.last_step_seqs = len(scheduled)
        for seq, n in scheduled:
            was_prefilling = seq.num_computed < seq.num_prompt
            seq.num_computed += n
            if was_prefilling and seq.num_computed >= seq.num_prompt and self.prefix_cache is not None:
                self._remember_prefix(seq)
        finished = []
        ids, values = greedy_top2(logprobs)
        for seq, (top1, top2), (lp1, lp2) in zip(sampling, ids, values):
            seq.token_ids.append(top1)
            seq.top1_ids.append(top1)
            seq.top1_logprobs.append(lp1)
            seq.top2_ids.append(top2)
            seq.top2_logprobs.append(lp2)
            self.stats.generated_tokens += 1
            if top1 in self.eos_token_ids and not seq.params.ignore_eos:
                seq.finish_reason = "stop"
            elif seq.num_generated >= seq.params.max_tokens:
                seq.finish_reason = "length"
            else:
                continue
            self.scheduler.finish(seq)
            self.cache.release(seq.slot)
            finished.append(seq.completion())
        return finished

    def _unfinished(self, request_id: Any) -> Sequence | None:
        return next((s for s in (*self.scheduler.running, *self.scheduler.waiting) if s.request_id == request_id), None)

    def progress(self, request_id: Any) -> Completion | None:
        """What an unfinished request has generated so far (streaming, stop strings); None when it is
        finished or unknown."""
        seq = self._unfinished(request_id)
        return None if seq is None else seq.completion()

    def abort(self, request_id: Any, reason: str = "abort") -> Completion | None:
        """Finish an unfinished request now (a stop string matched, its client went away) and free its
        slot for the next step; its completion so far, or None when it is finished or unknown."""
        seq = self._unfinished(request_id)
        if seq is None:
            return None
        if seq.status is SeqStatus.WAITING:
            self.scheduler.waiting.remove(seq)
        else:
            self.scheduler.finish(seq)
            self.cache.release(seq.slot)
        seq.finish_reason = reason
        return seq.completion()

    def generate(self, requests: Iterable[Request],
                 on_finish: Callable[[Completion], None] | None = None) -> list[Completion]:
        """Run requests to completion through the scheduler; completions come back in request order."""
        order = []
        for request in requests:
            self.add_request(request)
            order.append(request.request_id)
        done: dict[Any, Completion] = {}
        while self.scheduler.has_unfinished():
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


