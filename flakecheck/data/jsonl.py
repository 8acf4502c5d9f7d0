"""JSON Lines as users write them: one object a line, blank lines (and, where a format allows, comment lines)
skipped, an error naming the file and the line for anything else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flakecheck.errors import InputError


def json_objects(name: str, text: str, *, comments: tuple[str, ...] = (), what: str = ""
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every line of `text` that holds one; InputError(name, line, ...) for a line
    that is not JSON or not an object. `what`: the format, named in the message ("an lm-eval samples file")."""
    def fail(number: int, message: str) -> InputError:
        return InputError(name, number, None, f"not {what} ({message})" if what else message)

    for number, raw in enumerate(text.split("\n"), start=1):
        stripped = raw.strip()
        if not stripped or (comments and stripped.startswith(comments)):
            continue
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise fail(number, f"malformed JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(obj, dict):
            raise fail(number, f"expected a JSON object per line, got {json_kind(obj)}")
        yield number, obj


def json_kind(value: Any) -> str:
    """A JSON value's kind as an error message names it: 'a string', 'a number (3)', 'an array', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
