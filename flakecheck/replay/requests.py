"""What a replay sends the engine: each case as a request, and synthetic fillers beside them.

A request's id says its kind: a case's id is the case id (a string); a filler's is a `FillerId`. Only cases
become traces; a filler shapes its steps (and, through a prefix cache, can share KV with a case).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flakecheck.data.compositions import Composition, arrival_order, make_fillers
from flakecheck.data.routing import routing_digest
from flakecheck.data.traces import Trace
from flakecheck.engine import Completion, Knobs, Request, SamplingParams
from flakecheck.engine.prefix_cache import BLOCK_SIZE, block_hashes


@dataclass(frozen=True)
class CaseRequest:
    """A suite case as the engine sees it: its id, prompt token ids and token limit."""

    case_id: str
    prompt_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class FillerId:
    """The request id of the k-th synthetic filler of a composition (negative: a shape-only case)."""

    index: int


def is_filler(request_id: Any) -> bool:
    return isinstance(request_id, FillerId)


def shape_only(request: Request) -> bool:
    """A filler of fixed length: nothing reads what it generates, and its length does not depend on it."""
    return is_filler(request.request_id) and request.params.ignore_eos


def readable_blocks(requests: Sequence[Request], block_size: int = BLOCK_SIZE) -> frozenset[int]:
    """The prefix-cache blocks (chained hashes) the computed requests among `requests` could load."""
    return frozenset(h for r in requests if not shape_only(r)
                     for h in block_hashes(r.prompt_ids[:-1], block_size, r.cache_salt))


def shape_from(request: Request, readable: frozenset[int] | None, block_size: int = BLOCK_SIZE) -> int | None:
    """Where a request's computed rows end (Request.shape_from): None for a case (every row); a filler of fixed
    length computes none — under a prefix cache (`readable`: its `readable_blocks`), none but the prompt blocks
    a computed request could load from it. A block a computed request loads was published by a request whose
    prompt starts with it (the hashes are chained), so that request computed it."""
    if not shape_only(request):
        return None
    if readable is None:
        return 0
    shared = 0
    for h in block_hashes(request.prompt_ids, block_size, request.cache_salt):  # chained: a prefix run
        if h not in readable:
            break
        shared += 1
    return shared * block_size


def knobs(composition: Composition) -> Knobs:
    """The engine knobs a composition sets (its axes declare them: flakecheck/data/axes/)."""
    return Knobs(**composition.engine_knobs())


def trace_of(c: Completion, composition: str, repeat: int) -> Trace:
    routing = c.routing
    return Trace(str(c.request_id), composition, repeat, c.token_ids, c.top1_ids, c.top1_logprobs,
                 c.top2_ids, c.top2_logprobs, c.finish_reason, c.top1_logits,
                 None if routing is None else [r.margin for r in routing],
                 None if routing is None else [r.layer for r in routing],
                 None if routing is None else [routing_digest(r.experts) for r in routing])


def build_requests(cases: Sequence[CaseRequest], composition: Composition, repeat: int,
                   vocab_size: int, special_ids: frozenset[int]) -> list[Request]:
    """Cases in this composition's arrival order, fillers spread evenly among them (or arriving later)."""
    order = arrival_order(len(cases), composition, repeat)
    shaped = dict(composition.shape_only)
    # a case no longer measured keeps its place as a filler of its own prompt and its reference's length:
    # it shapes its batch-mates' steps as the case would, and computes only what a case can read (shape_from)
    requests = [Request(FillerId(-1 - i), cases[i].prompt_ids, SamplingParams(shaped[cases[i].case_id], True))
                if cases[i].case_id in shaped else
                Request(cases[i].case_id, cases[i].prompt_ids, SamplingParams(cases[i].max_tokens)) for i in order]
    fillers = make_fillers(composition, vocab_size, special_ids, repeat, len(cases))
    as_request = [Request(FillerId(k), f.prompt_ids, SamplingParams(f.max_tokens, True), f.arrival)
                  for k, f in enumerate(fillers)]
    together = [r for r in as_request if r.arrival == 0]
    # The scheduler keeps submission order among equal arrival steps: interleaving makes the
    # fillers batch-mates of the cases instead of a tail that runs after them. Inserting from
    # the back keeps the earlier positions valid.
    for k in range(len(together) - 1, -1, -1):
        requests.insert(round((k + 1) * len(cases) / (len(together) + 1)), together[k])
    requests.extend(r for r in as_request if r.arrival > 0)
    return requests
