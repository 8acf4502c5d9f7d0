"""A request as the engine tracks it: prompt, generated tokens, their top-2 logprobs, KV progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from flakecheck.engine.routing import RowRouting

LINEAGE_ROOT = bytes(16)  # the lineage digest before a sequence's first position: no keys and values yet


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    ignore_eos: bool = False


@dataclass
class Completion:
    """A finished request: its generated tokens and, per token, the top-2 candidates (greedy: top-1 chosen)."""

    request_id: Any
    prompt_ids: list[int]
    token_ids: list[int]
    top1_ids: list[int]
    top1_logprobs: list[float]
    top2_ids: list[int]
    top2_logprobs: list[float]
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens)
    cached_prompt_tokens: int = 0
    top1_logits: list[float] = field(default_factory=list)  # the chosen token's raw logit (model dtype)
    routing: list[RowRouting] | None = None  # per token, a mixture of experts' routing (None: a dense model)


@dataclass
class Sequence:
    request_id: Any
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int = 0
    cache_salt: str | None = None  # prefix-cache blocks are shared only between requests with the same salt
    shape_from: int | None = None  # simulated replay computes only the positions before it (Request.shape_from)
    token_ids: list[int] = field(init=False)
    num_computed: int = 0  # tokens whose keys and values are in the cache
    cached_prompt_tokens: int = 0
    slot: int | None = None
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: str | None = None
    top1_ids: list[int] = field(default_factory=list)
    top1_logprobs: list[float] = field(default_factory=list)
    top2_ids: list[int] = field(default_factory=list)
    top2_logprobs: list[float] = field(default_factory=list)
    top1_logits: list[float] = field(default_factory=list)
    routing: list[RowRouting] = field(default_factory=list)  # per generated token (a mixture of experts)
    # per computed position, a digest of what its keys and values are the result of (simulated replay
    # computes rows with equal digests once: flakecheck/replay/shared_rows.py); None where unknown
    lineage: list[bytes | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id!r}: empty prompt")
        self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_pending(self) -> int:
        """Tokens not yet in the cache: the rest of the prompt, or the one token sampled last step."""
        return len(self.token_ids) - self.num_computed

    def computed_of(self, n: int) -> int:
        """How many of its next n rows simulated replay computes (the rest only shape their step)."""
        return n if self.shape_from is None else max(0, min(n, self.shape_from - self.num_computed))

    @property
    def max_length(self) -> int:
        return self.num_prompt + self.params.max_tokens

    def lineage_before(self, position: int) -> bytes | None:
        """The lineage digest of the keys and values before `position` (LINEAGE_ROOT at 0); None where unknown."""
        if position == 0:
            return LINEAGE_ROOT
        return self.lineage[position - 1] if len(self.lineage) >= position else None

    def completion(self) -> Completion:
        return Completion(
            self.request_id,
            self.prompt_ids,
            self.token_ids[self.num_prompt :],
            self.top1_ids,
            self.top1_logprobs,
            self.top2_ids,
            self.top2_logprobs,
            self.finish_reason or "length",
            self.cached_prompt_tokens,
            self.top1_logits,
            self.routing if self.routing else None,
        )
