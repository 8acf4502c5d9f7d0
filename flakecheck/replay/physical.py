"""Physical replay: the whole suite through one engine's scheduler under one composition.

Batch-mates are the other cases plus synthetic filler requests, as in a real server; this is never a loop
of solo calls. Every step is its own forward pass, so it is right for any kernels, the framework's own
(`native`) included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flakecheck.data.compositions import Composition
from flakecheck.data.traces import Trace
from flakecheck.engine import Completion, LLMEngine
from flakecheck.replay.requests import CaseRequest, build_requests, is_filler, knobs, trace_of


def replay(engine: LLMEngine, cases: Sequence[CaseRequest], composition: Composition, repeat: int,
           on_case_done: Callable[[Trace], None] | None = None) -> list[Trace]:
    """Every case under one composition, through the scheduler; traces in suite order."""
    engine.configure(knobs(composition))
    vocab = engine.loaded.config.vocab_size
    special = frozenset(getattr(engine.loaded.tokenizer, "all_special_ids", []) or []) | engine.eos_token_ids
    traces: dict[str, Trace] = {}

    def finished(completion: Completion) -> None:
        if is_filler(completion.request_id):
            return
        trace = trace_of(completion, composition.name, repeat)
        traces[trace.case_id] = trace
        if on_case_done is not None:
            on_case_done(trace)

    engine.generate(build_requests(cases, composition, repeat, vocab, special), on_finish=finished)
    return [traces[c] for c in composition.measured([c.case_id for c in cases])]
