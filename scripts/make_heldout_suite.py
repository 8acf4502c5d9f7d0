"""Write a held-out suite of open-ended chat cases (seeded): material the flip predictions were not tuned on.

    python scripts/make_heldout_suite.py suites/heldout-open.jsonl --cases 24

Each case asks for a few sentences on a topic drawn from a fixed list, with no checks (the answers are
compared token by token, not graded), 32 new tokens each.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

TOPICS = ("the sea at night", "a quiet library", "an old bridge", "the first snow", "a busy market",
          "a lost letter", "a mountain village", "a summer storm", "a train station", "a forest path",
          "a lighthouse keeper", "a city at dawn", "an empty theatre", "a garden in autumn", "a river crossing",
          "a small bakery", "a desert road", "a school bell", "a winter harbour", "a clock tower")
# a second set of topics, for material no earlier measurement drew from (the suites of 2026-12-07 on)
FRESH_TOPICS = ("a night bus", "a fishing boat", "a broken umbrella", "a chess club", "a hot air balloon",
                "a village fair", "an abandoned mine", "a rooftop garden", "a lost dog", "a paper kite",
                "a frozen lake", "a second-hand bookshop", "a power cut", "a long queue", "a street musician",
                "a wedding speech", "a windmill", "a museum guard", "a spring flood", "a ferry crossing")
FRESH_ASKS = ("Write a diary entry about {}.", "Tell a child about {}.", "Write a short poem about {}.",
              "Summarise what makes {} memorable.")
# a third set, for material no measurement before the ranking's target drew from (2026-12-07, late)
THIRD_ASKS = ("Describe {} to a visitor.", "Write a limerick about {}.", "List three sounds of {}.",
              "Explain what a painter would notice about {}.")
ASKS = ("Describe {} in three sentences.", "Write a short story about {}.", "Explain why people remember {}.",
        "Give two facts and one opinion about {}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--fresh-topics", action="store_true",
                        help="draw from the second set of topics, which no suite before 2026-12-07 used")
    parser.add_argument("--fresh-asks", action="store_true",
                        help="ask the second set of questions, which no suite before 2026-12-07 asked")
    parser.add_argument("--third-asks", action="store_true",
                        help="ask the third set of questions, which no suite before the ranking's target asked")
    parser.add_argument("--with-replacement", action="store_true",
                        help="draw each case independently, repeats allowed (how suites of seeds 25 and 907 were made)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    topics = FRESH_TOPICS if args.fresh_topics else TOPICS
    if args.fresh_asks and args.third_asks:
        parser.error("--fresh-asks and --third-asks: one set of questions")
    asks = THIRD_ASKS if args.third_asks else FRESH_ASKS if args.fresh_asks else ASKS
    if args.with_replacement:
        questions = [rng.choice(asks).format(rng.choice(topics)) for _ in range(args.cases)]
    else:  # distinct questions: a repeated one would count one answer's flips several times
        pairs = [(ask, topic) for ask in asks for topic in topics]
        if args.cases > len(pairs):
            parser.error(f"--cases: at most {len(pairs)} distinct questions")
        questions = [ask.format(topic) for ask, topic in rng.sample(pairs, args.cases)]
    lines = [json.dumps({"id": f"open-{i:02d}", "input": [{"role": "user", "content": q}], "max_tokens": 32})
             for i, q in enumerate(questions)]
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
