"""Stop sequences as an OpenAI-compatible server applies them (`flakecheck serve`, vLLM), in a server's
answers and in a replay: the answer ends with the token whose text completes the first occurrence of any stop
sequence, and its text is cut before that occurrence.

The engine itself stops only at EOS or max_tokens, so a replay generates on and the trace is cut here, after
the fact. Greedy tokens depend only on the tokens before them, so the cut trace is the one a stopping server
gives for the same batch-mates; what differs is that the replayed sequence kept its batch slot a little
longer (a server frees it at the stop), which matters only to compositions above one sequence a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace


def stop_length(token_ids: Sequence[int], stops: Sequence[str], decode: Callable[[list[int]], str]) -> int | None:
    """How many tokens the answer keeps: the first k whose text contains a stop sequence; None when none does."""
    if not stops or find_stop(decode(list(token_ids)), stops) is None:
        return None
    for k in range(1, len(token_ids) + 1):
        if find_stop(decode(list(token_ids[:k])), stops) is not None:
            return k
    return None  # unreachable: the whole text has a stop


def apply_stops(traces: Sequence[Trace], cases: Sequence[Case], decode: Callable[[list[int]], str]
                ) -> tuple[list[Trace], dict[tuple[int, ...], str]]:
    """Every trace cut at its case's stop sequences (finish_reason "stop"), and the cut texts by token ids
    (the text a server returns: the decoded tokens up to the stop sequence, without it)."""
    stops = {case.id: case.stop for case in cases if case.stop}
    out: list[Trace] = []
    texts: dict[tuple[int, ...], str] = {}
    for trace in traces:
        case_stops = stops.get(trace.case_id, ())
        keep = stop_length(trace.token_ids, case_stops, decode) if case_stops else None
        if keep is None:
            out.append(trace)
            continue
        ids = trace.token_ids[:keep]
        text = decode(list(ids))
        cut = find_stop(text, case_stops)
        texts[tuple(ids)] = text[:cut] if cut is not None else text
        out.append(replace(
            trace, token_ids=ids, top1_ids=trace.top1_ids[:keep], top1_logprobs=trace.top1_logprobs[:keep],
            top2_ids=trace.top2_ids[:keep], top2_logprobs=trace.top2_logprobs[:keep], finish_reason="stop",
            top1_logits=None if trace.top1_logits is None else trace.top1_logits[:keep],
            routing_margins=None if trace.routing_margins is None else trace.routing_margins[:keep],
            routing_layers=None if trace.routing_layers is None else trace.routing_layers[:keep],
            routing_digests=None if trace.routing_digests is None else trace.routing_digests[:keep]))
    return out, texts


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index in `text` where the earliest stop string starts, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def streamable_length(text: str, stops: Sequence[str], finished: bool) -> int:
    """How much of an unfinished text may be streamed: not a tail that is the start of a stop string
    (the next tokens may complete it), nor a trailing replacement character (a UTF-8 sequence whose
    last bytes come with the next token)."""
    if finished:
        return len(text)
    end = len(text) - max((_partial_stop(text, s) for s in stops), default=0)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    return end


def _partial_stop(text: str, stop: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `stop`."""
    return next((k for k in range(min(len(stop) - 1, len(text)), 0, -1) if text.endswith(stop[:k])), 0)
