"""A replay honours a case's stop sequences as a server does: the answer keeps the tokens up to the one that
completes the first occurrence, and its text ends before it (flakecheck.serve's own stop rule decides where a
stop string starts, so the replay and `flakecheck serve` cut alike)."""

from __future__ import annotations

from flakecheck.data.stops import apply_stops
from flakecheck.data.suite import Case
from flakecheck.data.traces import Trace

PIECES = ["The", " answer", ".", "\n", "\nQ", ":", " next"]  # token id = index


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def trace(case_id: str, ids: list[int]) -> Trace:
    n = len(ids)
    return Trace(case_id, "solo", 0, ids, ids, [-0.1] * n, [0] * n, [-1.0] * n, "length", [9.0] * n)


def case(case_id: str, stop: tuple[str, ...]) -> Case:
    return Case(case_id, "x", (), (), None, {}, 1, "prompt", stop)


def test_the_trace_ends_at_the_token_completing_the_stop_and_the_text_before_it() -> None:
    ids = list(range(len(PIECES)))
    cut, texts = apply_stops([trace("a", ids), trace("b", ids), trace("c", ids)],
                             [case("a", ("\n\n",)), case("b", ("Q:", "answer")), case("c", ())], decode)
    a, b, c = cut
    assert a.token_ids == [0, 1, 2, 3, 4] and a.finish_reason == "stop"  # "\n" + "\nQ" completes "\n\n"
    assert texts[tuple(a.token_ids)] == "The answer."
    assert len(a.top1_logprobs) == len(a.top2_ids) == len(a.top1_logits or []) == 5
    assert b.token_ids == [0, 1] and texts[tuple(b.token_ids)] == "The "  # the earliest stop of several
    assert c == trace("c", ids) and tuple(ids) not in texts  # no stop: untouched
