"""Write suites/long-context.jsonl: chat cases whose prompts are a few hundred to ~1,400 tokens.

    .venv/bin/python scripts/make_long_context_suite.py [--out suites/long-context.jsonl]

Long prompts are where a real server's batch variance shows (attention over many keys, chunked
prefill): on vLLM, long contexts flipped answers under load where short prompts did not. Every
document here is generated from fixed word lists with a seeded random.Random, so the file is
reproducible byte for byte; each case's prompt is grown record by record until its chat-templated
length (SmolLM2's tokenizer) reaches the case's target, leaving room for 48 new tokens well within
a 2,048-token context. Questions whose answer is in the document carry a check.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_TOKENS = 48
CONTEXT = 2048
SYSTEM = "You are a careful assistant. Answer from the document only, briefly."

TOWNS = ["Ashford", "Brackley", "Cinderford", "Dunmore", "Elmswell", "Fenwick", "Glenrock", "Harlow", "Ivybridge",
         "Kelso", "Lydney", "Marden", "Norwood", "Oakham", "Penrith", "Redruth", "Selby", "Thirsk", "Usk", "Wareham"]
NAMES = ["Agnes", "Bertram", "Clara", "Desmond", "Edith", "Felix", "Greta", "Horace", "Ida", "Jasper", "Lena",
         "Martin", "Nora", "Oswald", "Pearl", "Rufus", "Sylvia", "Tobias", "Una", "Walter"]
GOODS = ["copper kettles", "wool blankets", "tin lanterns", "oak barrels", "linen sheets", "clay pots",
         "iron nails", "glass jars", "leather boots", "candle boxes", "rope coils", "salt sacks"]
WEATHER = ["rain", "fog", "a light frost", "clear skies", "a strong west wind", "sleet", "warm sunshine", "low cloud"]
CROPS = ["barley", "turnips", "apples", "hops", "flax", "oats", "pears", "cabbages"]
VERBS = ["repaired", "painted", "inspected", "cleaned", "measured", "rebuilt", "locked", "emptied"]
PLACES = ["the mill", "the bridge", "the chapel", "the granary", "the lighthouse", "the school", "the forge",
          "the old quay", "the tollhouse", "the orchard wall"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def number_check(value: int) -> dict[str, Any]:
    """The number stands alone somewhere in the answer: "51", "Crate 10: 51 clay pots" and "-1." pass for theirs.

    Not `numeric`, which reads the first number: a right answer that repeats the question's own
    number first ("Crate 10: 51", "the 05:00 departure leaves from platform 3") would fail it.
    Times ("05:00") and longer numbers never match.
    """
    return {"type": "regex", "value": rf"(?<![\d.:-]){value}(?![\d:-]|[.,]\d)"}


@dataclass
class Document:
    """Lines of a document, and the question (with its checks) asked about it."""

    title: str
    lines: list[str]
    question: str
    checks: list[dict[str, Any]]
    kind: str


def inventory(rng: random.Random, n: int) -> Document:
    lines, crates = [], []
    for i in range(1, n + 1):
        count, goods = rng.randint(3, 97), rng.choice(GOODS)
        crates.append((count, goods))
        lines.append(f"Crate {i}: {count} {goods}, shelf {rng.choice('ABCDEF')}{rng.randint(1, 9)}, "
                     f"received on {rng.choice(DAYS)} from {rng.choice(TOWNS)}.")
    pick = rng.randint(1, n)
    count, goods = crates[pick - 1]
    return Document("Warehouse receiving log", lines,
                    f"How many {goods} are in crate {pick}? Answer with the number only.",
                    [number_check(count)], "lookup_number")


def timetable(rng: random.Random, n: int) -> Document:
    lines, departures = [], []
    for i in range(n):
        time, platform = f"{5 + (i * 17) // 60 % 18:02d}:{(i * 17) % 60:02d}", rng.randint(1, 6)
        departures.append((time, platform))
        lines.append(f"{time} departure to {rng.choice(TOWNS)}, platform {platform}, "
                     f"calling at {rng.choice(TOWNS)} and {rng.choice(TOWNS)}; driver {rng.choice(NAMES)}.")
    time, platform = departures[rng.randrange(n)]
    return Document("Station timetable", lines,
                    f"From which platform does the {time} departure leave? Answer with the number only.",
                    [number_check(platform)], "lookup_number")


def diary(rng: random.Random, n: int) -> Document:
    lines, facts = [], []
    for day in range(1, n + 1):
        who, what, where = rng.choice(NAMES), rng.choice(VERBS), rng.choice(PLACES)
        facts.append((who, what, where))
        lines.append(f"Day {day}. There was {rng.choice(WEATHER)} in the morning. {who} {what} {where} before noon, "
                     f"and in the afternoon the village brought in the {rng.choice(CROPS)}.")
    pick = rng.randint(1, n)
    who, what, where = facts[pick - 1]
    return Document("A village diary", lines, f"Who {what} {where} on day {pick}? Answer with the name only.",
                    [{"type": "contains", "value": who}], "lookup_name")


def ledger(rng: random.Random, n: int) -> Document:
    lines, balance = [], 500
    for i in range(1, n + 1):
        amount = rng.randint(2, 60)
        sign = rng.choice([1, -1])
        balance += sign * amount
        verb = "paid in" if sign > 0 else "withdrew"
        lines.append(f"Entry {i}: {rng.choice(NAMES)} {verb} {amount} crowns for {rng.choice(GOODS)}; "
                     f"balance {balance} crowns.")
    return Document("Parish account book", lines,
                    "What is the balance after the last entry? Answer with the number only.",
                    [number_check(balance)], "lookup_number")


def letters(rng: random.Random, n: int) -> Document:
    lines = []
    for i in range(n):
        a, b = rng.sample(NAMES, 2)
        lines.append(f"Letter {i + 1}, from {a} in {rng.choice(TOWNS)} to {b}: the {rng.choice(CROPS)} are late this "
                     f"year because of {rng.choice(WEATHER)}, and {rng.choice(PLACES)} still needs to be "
                     f"{rng.choice(VERBS)}.")
    return Document("Bundle of letters", lines, "Summarise what these letters are mostly about in two sentences.",
                    [], "summary")


def records_code(rng: random.Random, n: int) -> Document:
    lines, rules = [], []
    for i in range(n):
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+*-")
        rules.append((a, b, op))
        lines.append(f"def rule_{i}(x):\n    \"\"\"Adjust the {rng.choice(GOODS)} count.\"\"\"\n"
                     f"    return x {op} {a} {op} {b}\n")
    pick = rng.randrange(n)
    a, b, op = rules[pick]
    value = {"+": 10 + a + b, "*": 10 * a * b, "-": 10 - a - b}[op]
    return Document("A Python module", lines, f"What does rule_{pick}(10) return? Answer with the number only.",
                    [number_check(value)], "code_trace")


KINDS: list[tuple[str, Callable[[random.Random, int], Document]]] = [
    ("inventory", inventory), ("timetable", timetable), ("diary", diary), ("ledger", ledger),
    ("letters", letters), ("code", records_code),
]
# Target prompt lengths (chat-templated tokens): a spread from a few hundred to ~1,400.
TARGETS = [300, 420, 540, 660, 780, 900, 1020, 1140, 1260, 1380]


def messages(doc: Document) -> list[dict[str, str]]:
    text = f"{doc.title}:\n\n" + "\n".join(doc.lines) + f"\n\nQuestion: {doc.question}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def grow(make: Callable[[random.Random, int], Document], seed: int, target: int,
         count: Callable[[list[dict[str, str]]], int]) -> tuple[Document, int]:
    """The document with the most records (from this seed) whose prompt is at most `target` tokens."""
    lo, hi = 3, 400  # prompt length grows with the record count: bisect on it
    if count(messages(make(random.Random(seed), lo))) > target:
        raise ValueError(f"{make.__name__}: even {lo} records exceed {target} tokens")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(messages(make(random.Random(seed), mid))) <= target:
            lo = mid
        else:
            hi = mid
    doc = make(random.Random(seed), lo)
    return doc, count(messages(doc))


def build(count: Callable[[list[dict[str, str]]], int], n_cases: int = 20) -> list[dict[str, Any]]:
    cases = []
    for i in range(n_cases):
        kind, make = KINDS[i % len(KINDS)]
        target = TARGETS[i % len(TARGETS)]
        doc, tokens = grow(make, seed=1000 + i, target=target, count=count)
        assert tokens + MAX_TOKENS <= CONTEXT
        cases.append({"id": f"long-{i + 1:02d}-{kind}", "input": messages(doc), "checks": doc.checks,
                      "max_tokens": MAX_TOKENS,
                      "metadata": {"kind": doc.kind, "prompt_tokens": tokens, "records": len(doc.lines)}})
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(__file__).resolve().parent.parent / "suites" / "long-context.jsonl"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from flakecheck.engine.loader import resolve_model_dir

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir("smollm2")[0])

    def count(msgs: list[dict[str, str]]) -> int:
        return len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))

    cases = build(count)
    args.out.write_text("".join(json.dumps(case) + "\n" for case in cases))
    lengths = [c["metadata"]["prompt_tokens"] for c in cases]
    print(f"{args.out}: {len(cases)} cases, prompts {min(lengths)}-{max(lengths)} tokens")


if __name__ == "__main__":
    main()
