"""Where a log has no logprobs (lm-eval's API models; inspect without --logprobs) two answers are compared
by text: each is cut into units of a word with the whitespace before it, or one punctuation character with
the whitespace before it (and any trailing whitespace), close to how a BPE tokenizer cuts English. The units
join back to the text exactly, so the first divergence is the first unit that differs. The run directory
says so (meta.json `import.divergence_by`, and per case `metadata.divergence_by`)."""

from __future__ import annotations

import re

_UNIT = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def text_units(text: str) -> list[str]:
    return _UNIT.findall(text)
