"""Replay: push the whole suite through the engine's scheduler under one composition.

Batch-mates are the other cases plus synthetic filler requests, as in a real server; this is
never a loop of solo calls. Only the cases' completions become traces; fillers are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flakecheck.compositions import Composition, arrival_order, make_fillers
from flakecheck.engine import Completion, LLMEngine, Request, SamplingParams


@dataclass(frozen=True)
class CaseRequest:
    """A suite case as the engine sees it: its id, prompt token ids and token limit."""

    case_id: str
    prompt_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Trace:
    """What one case generated under one (composition, repeat)."""

    case_id: str
    composition: str
    repeat: int
    token_ids: list[int]
    top1_ids: list[int]
    top1_logprobs: list[float]
    top2_ids: list[int]
    top2_logprobs: list[float]
    finish_reason: str

    @classmethod
    def from_completion(cls, c: Completion, composition: str, repeat: int) -> Trace:
        return cls(str(c.request_id), composition, repeat, c.token_ids, c.top1_ids, c.top1_logprobs,
                   c.top2_ids, c.top2_logprobs, c.finish_reason)


def build_requests(cases: Sequence[CaseRequest], composition: Composition, repeat: int,
                   vocab_size: int, special_ids: frozenset[int]) -> list[Request]:
    """Cases in this composition's arrival order, fillers spread evenly among them (or arriving later)."""
    order = arrival_order(len(cases), composition, repeat)
    requests = [Request(cases[i].case_id, cases[i].prompt_ids, SamplingParams(cases[i].max_tokens)) for i in order]
    fillers = make_fillers(composition, vocab_size, special_ids, repeat, len(cases))
    as_request = [Request(("filler", k), f.prompt_ids, SamplingParams(f.max_tokens, True), f.arrival)
                  for k, f in enumerate(fillers)]
    together = [r for r in as_request if r.arrival == 0]
    # The scheduler keeps submission order among equal arrival steps: interleaving makes the
    # fillers batch-mates of the cases instead of a tail that runs after them. Inserting from
    # the back keeps the earlier positions valid.
    for k in range(len(together) - 1, -1, -1):
        requests.insert(round((k + 1) * len(cases) / (len(together) + 1)), together[k])
    requests.extend(r for r in as_request if r.arrival > 0)
    return requests


def replay(engine: LLMEngine, cases: Sequence[CaseRequest], composition: Composition, repeat: int,
           on_case_done: Callable[[Trace], None] | None = None) -> list[Trace]:
    """Every case under one composition, through the scheduler; traces in suite order."""
    engine.reconfigure(composition.max_batch, composition.chunk, composition.prefix_cache)
    vocab = engine.loaded.config.vocab_size
    special = frozenset(getattr(engine.loaded.tokenizer, "all_special_ids", []) or []) | engine.eos_token_ids
    traces: dict[str, Trace] = {}

    def finished(completion: Completion) -> None:
        if isinstance(completion.request_id, tuple):  # a filler
            return
        trace = Trace.from_completion(completion, composition.name, repeat)
        traces[trace.case_id] = trace
        if on_case_done is not None:
            on_case_done(trace)

    engine.generate(build_requests(cases, composition, repeat, vocab, special), on_finish=finished)
    return [traces[c.case_id] for c in cases]
