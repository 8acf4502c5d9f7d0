"""Load levels: the compositions of a server probe.

A level keeps `concurrency` case requests in flight (closed loop: a new one starts as soon as one
finishes) in a shuffled order, seeded by the level and the repeat. Concurrency 1 in suite order is
the reference: what a server started with `--max-num-seqs 1` (or `--parallel 1`) gives. With
`fillers`, that many more requests run beside the cases from the first case to the last, each
slot sending a new filler as soon as its previous one ends, so the server's batch stays full
while the cases run; filler prompts are word strings of mixed lengths drawn from a seeded
generator (nobody reads their answers). The `prefix` level is serial too, but sends each case
right after a one-token warm-up request with the same prompt, with prefix caching allowed between
the two: a divergence there is the server's prefix cache's alone.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from flakecheck.errors import UserError

REFERENCE = "c1"
PREFIX = "prefix"
ORDER_SEED = 0
FILLER_WORDS = (
    "river stone window garden paper light morning city music table winter forest number letter story "
    "bridge market summer yellow quiet history planet engine signal orange simple measure distant common "
    "animal village ocean travel silver mountain question reason careful pattern evening machine"
).split()
FILLER_PROMPT_WORDS = (8, 320)  # inclusive range: short to long prompts
FILLER_MAX_TOKENS = (8, 64)


@dataclass(frozen=True)
class LoadLevel:
    name: str
    concurrency: int
    fillers: int = 0
    shuffled: bool = False
    warm_prefix: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def order(self, n_cases: int, repeat: int) -> list[int]:
        """The order the cases are sent in: suite order, or a shuffle seeded by the level and the repeat."""
        order = list(range(n_cases))
        if self.shuffled:
            random.Random(f"{ORDER_SEED}:{self.name}:{repeat}").shuffle(order)
        return order


def parse_concurrency(spec: str) -> list[int]:
    """`1,8,32` -> [1, 8, 32] (sorted, de-duplicated); 1, the serial reference, must be there."""
    values: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise UserError(f"--concurrency: {part!r} is not an integer (expected e.g. 1,8,32)") from None
        if value < 1:
            raise UserError(f"--concurrency: {value} must be >= 1")
        values.add(value)
    if 1 not in values:
        raise UserError("--concurrency must include 1: the serial reference every other level is compared with")
    return sorted(values)


def make_levels(concurrency: list[int], fillers: int, prefix: bool) -> list[LoadLevel]:
    """The reference first, then each higher concurrency (with the fillers), then the prefix level."""
    if fillers < 0:
        raise UserError(f"--fillers must be >= 0, got {fillers}")
    levels = [LoadLevel(REFERENCE, 1)]
    for n in concurrency:
        if n > 1:
            name = f"c{n}" if not fillers else f"c{n}+f{fillers}"
            levels.append(LoadLevel(name, n, fillers, shuffled=True))
    if prefix:
        levels.append(LoadLevel(PREFIX, 1, warm_prefix=True))
    return levels


@dataclass(frozen=True)
class FillerPrompt:
    """A filler request sent to a server: its text prompt and token limit."""

    prompt: str
    max_tokens: int


def filler(index: int, level: str, repeat: int) -> FillerPrompt:
    """The index-th filler request of a level: the same words every time for the same (level, repeat)."""
    rng = random.Random(f"filler:{ORDER_SEED}:{level}:{repeat}:{index}")
    words = rng.randint(*FILLER_PROMPT_WORDS)
    return FillerPrompt(" ".join(rng.choice(FILLER_WORDS) for _ in range(words)), rng.randint(*FILLER_MAX_TOKENS))
