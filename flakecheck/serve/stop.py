"""Stop strings as OpenAI applies them: the text ends before the first occurrence of any of them."""

from __future__ import annotations

from collections.abc import Sequence


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
