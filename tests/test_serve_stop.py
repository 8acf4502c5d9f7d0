"""Stop strings: a stream never sends text that the stop string later cuts, and ends where OpenAI does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flakecheck.data.stops import find_stop, streamable_length

ALPHABET = st.sampled_from("ab c\ufffd")


@given(text=st.text(ALPHABET, max_size=30), stops=st.lists(st.text(ALPHABET.filter(lambda c: c != "\ufffd"),
                                                                 min_size=1, max_size=4), max_size=3))
def test_streamed_text_is_the_final_text(text: str, stops: list[str]) -> None:
    """Grow the text one character at a time, as tokens arrive; stream what may be streamed; stop at
    the first stop string. What was streamed must equal the final (trimmed) text."""
    streamed, final = "", None
    for end in range(1, len(text) + 1):
        sofar = text[:end]
        cut = find_stop(sofar, stops)
        if cut is not None:
            final = sofar[:cut]
            streamed += final[len(streamed):]
            break
        assert sofar.startswith(streamed)
        streamed = sofar[: max(len(streamed), streamable_length(sofar, stops, finished=False))]
        assert final_prefix_ok(streamed, text, stops)
    if final is None:
        final = text
        streamed += text[len(streamed):]
    assert streamed == final
    cut = find_stop(text, stops)
    assert final == (text if cut is None else text[:cut])


def final_prefix_ok(streamed: str, text: str, stops: list[str]) -> bool:
    cut = find_stop(text, stops)
    return (text if cut is None else text[:cut]).startswith(streamed)


def test_find_stop_takes_the_earliest() -> None:
    assert find_stop("one two three", ["three", "two"]) == 4
    assert find_stop("one", ["x"]) is None
    assert streamable_length("abc", ["cd"], finished=False) == 2
    assert streamable_length("abc", ["cd"], finished=True) == 3
