"""The generated workload of a conformance check: prompts drawn from a seeded generator, so two servers
(or two runs against one) are sent exactly the same requests.

- targets: the prompts whose answers are compared (word prompts of mixed lengths; a language model reads
  them with little confidence, so their answers are full of near-ties, where a change of the numbers shows
  up as a change of tokens); the suite's cases, when given, are targets too;
- fillers: the other requests in flight beside a target (nobody reads their answers); they leave just after
  the targets and ask for a few more tokens, so they are still decoding when the targets end;
- long prompts: targets for the chunked-prefill axis, longer (in words, about one token each) than the
  server's chunk budget;
- prefix pairs: a target and a sibling prompt that shares its first words, for the prefix-cache axis.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from flakecheck.data.suite import Messages
from flakecheck.probe.levels import FILLER_WORDS


@dataclass(frozen=True)
class Prompt:
    """One prompt as it is sent: `text` for the completions API, or chat messages."""

    name: str
    api: str  # completions | chat
    text: str | Messages
    max_tokens: int
    stop: tuple[str, ...] = ()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(n))


def _as_api(text: str, api: str) -> str | Messages:
    return text if api == "completions" else [{"role": "user", "content": text}]


@dataclass(frozen=True)
class Workload:
    """Every prompt of one conformance check, from (seed, sizes, api)."""

    seed: int
    api: str  # completions | chat: how the generated prompts are sent
    n_targets: int
    max_tokens: int
    chunk_budget: int  # tokens; the long prompts are longer than this

    def targets(self) -> list[Prompt]:
        rng = random.Random(f"conformance:{self.seed}:targets")
        return [Prompt(f"t{i}", self.api, _as_api(_words(rng, rng.randint(24, 96)), self.api), self.max_tokens)
                for i in range(self.n_targets)]

    def filler(self, index: int) -> Prompt:
        """The index-th filler: the same words every time for the same seed."""
        rng = random.Random(f"conformance:{self.seed}:filler:{index}")
        text = _as_api(_words(rng, rng.randint(8, 64)), self.api)
        return Prompt(f"f{index}", self.api, text, self.max_tokens + 4)

    def long_prompt(self) -> Prompt:
        """One prompt half again as long as the chunk budget: its prefill must take more than one chunk."""
        rng = random.Random(f"conformance:{self.seed}:long")
        return Prompt("long", self.api, _as_api(_words(rng, self.chunk_budget * 3 // 2), self.api), self.max_tokens)

    def prefix_sibling(self, target: Prompt) -> Prompt:
        """A prompt that shares all but the last few words of `target`'s text: a request with it leaves the
        target's prefix in the server's cache without being the target itself."""
        text = target.text if isinstance(target.text, str) else str(target.text[-1].get("content") or "")
        words = text.split(" ")
        rng = random.Random(f"conformance:{self.seed}:sibling:{target.name}")
        sibling = " ".join(words[: max(1, len(words) - 4)] + [_words(rng, 4)])
        if isinstance(target.text, str):
            return Prompt(f"{target.name}-sibling", target.api, sibling, 1)
        messages = [*target.text[:-1], {**target.text[-1], "content": sibling}]
        return Prompt(f"{target.name}-sibling", target.api, messages, 1)
