"""Write suites/large.jsonl: 1,000 short questions with checks, for timing a big suite (`bench scale`).

Every question is generated here from arithmetic, the calendar, the alphabet, word spelling and a table of
capital cities (facts, not anyone's text), so the suite is this project's own work under its licence.
Deterministic: the same file every time. Usage: python scripts/make_large_suite.py [OUT] [N]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SYSTEM = "You are a concise assistant. Answer with the answer only."
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Canada": "Ottawa", "Australia": "Canberra",
    "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Egypt": "Cairo", "Kenya": "Nairobi", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw", "Greece": "Athens",
    "Turkey": "Ankara", "Russia": "Moscow", "Mexico": "Mexico City", "Peru": "Lima", "Chile": "Santiago",
    "Ireland": "Dublin", "Austria": "Vienna", "Hungary": "Budapest", "Thailand": "Bangkok", "Vietnam": "Hanoi",
}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
WORDS = ["window", "garden", "planet", "orange", "bridge", "silver", "market", "candle", "rocket", "forest",
         "pencil", "harbor", "castle", "meadow", "winter", "button", "ladder", "basket", "violet", "anchor"]


def case(index: int, kind: str, question: str, target: str, check: dict) -> dict:
    return {"id": f"{kind}-{index:04d}", "input": [{"role": "system", "content": SYSTEM},
                                                   {"role": "user", "content": question}],
            "target": target, "checks": [check], "max_tokens": 16, "metadata": {"kind": kind}}


def make(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        kind = ("add", "multiply", "subtract", "minutes", "capital", "weekday", "letter", "length")[i % 8]
        if kind == "add":
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            cases.append(case(i, kind, f"What is {a} + {b}?", str(a + b), {"type": "numeric"}))
        elif kind == "multiply":
            a, b = rng.randint(2, 40), rng.randint(2, 40)
            cases.append(case(i, kind, f"What is {a} times {b}?", str(a * b), {"type": "numeric"}))
        elif kind == "subtract":
            a = rng.randint(100, 999)
            b = rng.randint(1, a)
            cases.append(case(i, kind, f"What is {a} minus {b}?", str(a - b), {"type": "numeric"}))
        elif kind == "minutes":
            h = rng.randint(2, 30)
            cases.append(case(i, kind, f"How many minutes are in {h} hours?", str(60 * h), {"type": "numeric"}))
        elif kind == "capital":
            country = rng.choice(sorted(CAPITALS))
            cases.append(case(i, kind, f"What is the capital of {country}?", CAPITALS[country],
                              {"type": "icontains", "value": CAPITALS[country]}))
        elif kind == "weekday":
            d, k = rng.randrange(7), rng.randint(1, 9)
            answer = DAYS[(d + k) % 7]
            cases.append(case(i, kind, f"What day of the week is {k} days after {DAYS[d]}?", answer,
                              {"type": "icontains", "value": answer}))
        elif kind == "letter":
            letter = chr(ord("A") + rng.randrange(25))
            answer = chr(ord(letter) + 1)
            cases.append(case(i, kind, f"Which letter comes right after {letter} in the English alphabet?", answer,
                              {"type": "regex", "value": rf"\b{answer}\b"}))
        else:
            word = rng.choice(WORDS)
            cases.append(case(i, kind, f"How many letters are in the word '{word}'?", str(len(word)),
                              {"type": "numeric"}))
    return cases


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "suites" / "large.jsonl"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    out.write_text("".join(json.dumps(c) + "\n" for c in make(n)), encoding="utf-8")
    print(f"wrote {n} cases to {out}")


if __name__ == "__main__":
    main()
