"""The `--sample auto` rule replayed offline over two flat `--sample 32` runs' own draws (no engine).

    .venv/bin/python scripts/auto_offline.py FLAT_A FLAT_B [--draws 8,12,16] [--flat] [--undecided-first]

FLAT_A's per-draw traces stand in for the draws: the rule decides before each replay (1, 2, 2 and 3 rounds of 4
draws, as `run --sample auto`) which cases get FLAT_A's next draws, its flips counted against FLAT_A's
reference, the budget growing for the ranking as in a run. The result is compared with FLAT_B (another seed)
as `auto_vs_flat.py` does, and FLAT_A against FLAT_B is the retest. `--flat` gives every case the first N draws
instead (a flat pass of N): what N draws a case reach with no rule at all. `--undecided-first` runs the rule
as it was before the ranking was a target (the decided cases wait for the undecided; the budget never grows).

Every case of a replay sees the draw in full here, where `run --sample auto` keeps the cases it no longer
measures as shape-only requests of their reference's length, and counts the budget in case-rounds where the
run weighs each case's rounds by its tokens; the draws' own variety is the same. One JSON line per budget.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq
from adaptive_heldout import Counts, agreement  # this directory: the held-out comparison's own decisions
from auto_vs_flat import observed

from flakecheck.analysis.flip.adaptive import case_states
from flakecheck.analysis.flip.rank_target import ranked_round
from flakecheck.data.traces import Trace
from flakecheck.run.settings import DRAWS_PER_ROUND, ROUNDS_PER_REPLAY, auto_target

Key = tuple[str, str, int]  # case, composition, repeat


def traces(run: Path) -> dict[Key, Trace]:
    """Every trace of a run directory, rebuilt from its tokens and runs tables."""
    steps: dict[Key, list[dict]] = defaultdict(list)
    for row in pq.read_table(run / "tokens.parquet").to_pylist():
        steps[(row["case_id"], row["composition"], row["repeat"])].append(row)
    out = {}
    for row in pq.read_table(run / "runs.parquet").to_pylist():
        key = (row["case_id"], row["composition"], row["repeat"])
        rows = sorted(steps.get(key, []), key=lambda r: r["step"])
        out[key] = Trace(*key, [r["token_id"] for r in rows], [r["top1_id"] for r in rows],
                         [r["top1_logprob"] for r in rows], [r["top2_id"] for r in rows],
                         [r["top2_logprob"] for r in rows], row["finish_reason"], [r["top1_logit"] for r in rows])
    return out


@dataclass(frozen=True)
class FlatRun:
    """A flat run directory, read once: every trace, the draws in order, the reference and the dtype."""

    every: dict[Key, Trace]
    order: list[str]
    reference: str
    dtype: str

    @classmethod
    def read(cls, run: Path) -> FlatRun:
        meta = json.loads((run / "meta.json").read_text())
        return cls(traces(run), meta["flip"]["draws"], meta.get("reference") or "solo",
                   meta["config"].get("dtype") or "bfloat16")

    @property
    def cases(self) -> list[str]:
        return sorted({key[0] for key in self.every})

    def refs(self) -> dict[str, Trace]:
        return {c: self.every[(c, self.reference, 0)] for c in self.cases}


def replay_rule(flat: FlatRun, draws: int, rank: bool) -> Counts:
    """Each case's (flips, draws) when the rule at `draws` a case on average spends the flat run's draws."""
    cases, refs = flat.cases, flat.refs()
    target = auto_target(f"auto:{draws}")
    if not rank:
        target = replace(target, rank_decided=False, rank_goal=None)
    drawn: dict[str, list[Trace]] = {}
    rounds: dict[str, int] = {}
    spent, start, budget = 0.0, 0, target.budget_rounds
    for i, size in enumerate(ROUNDS_PER_REPLAY):
        batch = flat.order[start:start + size * DRAWS_PER_ROUND]
        start += size * DRAWS_PER_ROUND
        if i == 0:
            chosen = cases
        else:
            states = case_states(refs, drawn, rounds, flat.dtype)
            chosen, budget, _ = ranked_round(states, target, budget, spent, None, size, len(flat.order))
        for case in chosen:
            rounds[case] = rounds.get(case, 0) + size
            drawn.setdefault(case, []).extend(flat.every[(case, d, 0)] for d in batch)
        spent += size * len(chosen)
    return {c: (s.flips, s.draws) for c, s in case_states(refs, drawn, rounds, flat.dtype).items()}


def flat_first(flat: FlatRun, draws: int) -> Counts:
    """Each case's (flips, draws) over the run's first `draws` draws."""
    refs = flat.refs()
    return {c: (sum(flat.every[(c, d, 0)].token_ids != refs[c].token_ids for d in flat.order[:draws]),
                len(flat.order[:draws])) for c in flat.cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flat_a", type=Path)
    parser.add_argument("flat_b", type=Path)
    parser.add_argument("--draws", default="8,12,16", help="draws a case on average (the rule's budget)")
    parser.add_argument("--flat", action="store_true", help="every case the first N draws, no rule")
    parser.add_argument("--undecided-first", action="store_true",
                        help="the rule before the ranking was a target: the decided cases wait, the budget stays")
    args = parser.parse_args()
    flat, other = FlatRun.read(args.flat_a), observed(args.flat_b)
    retest = {k: round(v, 4) for k, v in agreement(observed(args.flat_a), other).items()}
    for n in (int(x) for x in args.draws.split(",")):
        mine = flat_first(flat, n) if args.flat else replay_rule(flat, n, not args.undecided_first)
        common = {c: other[c] for c in other if c in mine}
        print(json.dumps({"draws": n, "mode": "flat" if args.flat else "rule", "ranked": not args.undecided_first,
                          **{k: round(v, 4) for k, v in agreement(mine, common).items()},
                          "draws_mean": round(sum(d for _, d in mine.values()) / len(mine), 2),
                          "retest": retest}))


if __name__ == "__main__":
    main()
