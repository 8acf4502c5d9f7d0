"""How a server's flips depend on what a serial answer shows: per-step break rates by reference gap, and how
well the observed flip rates repeat (the bound any prediction from the serial answer is held to).

    python scripts/tie_break_rates.py SERIAL REPEATED [REPEATED2]

SERIAL is a `flakecheck probe --concurrency 1` run directory (with `--noise`, its `p_flip_pred` is compared);
each REPEATED is a `flakecheck probe --concurrency 1,N --repeat K` run of the same suite. A loaded draw "reaches"
a reference step when its tokens equal the reference's up to it, and "breaks" there when its token differs.
Steps are grouped by the reference's top-1/top-2 logprob gap (exact tie, ≤ 1/16, 1/8, ≤ 1/4, wider); the
group's pooled break rate, fitted on the draws themselves, gives the best prediction that reads gaps only.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from flakecheck.analysis.divergence import first_divergence
from flakecheck.analysis.flip.calibration import auroc, spearman

GAP_CLASSES = ((1e-6, "tie"), (0.0626, "<=1/16"), (0.1251, "1/8"), (0.2501, "<=1/4"), (float("inf"), "wider"))


def gap_class(gap: float) -> str:
    return next(name for bound, name in GAP_CLASSES if gap <= bound)


def reference(serial: Path) -> tuple[dict[str, list[int]], dict[tuple[str, int], float], dict[str, float | None]]:
    runs = pq.read_table(serial / "runs.parquet").to_pylist()
    first = {}
    for r in runs:  # the first draw of the serial level is the reference
        if (r["case_id"] not in first) or r["repeat"] < first[r["case_id"]]["repeat"]:
            first[r["case_id"]] = r
    tokens = {c: list(r["token_ids"]) for c, r in first.items()}
    gaps = {}
    for t in pq.read_table(serial / "tokens.parquet").to_pylist():
        if t["repeat"] == first[t["case_id"]]["repeat"] and t["composition"] == first[t["case_id"]]["composition"]:
            gaps[(t["case_id"], t["step"])] = t["top1_logprob"] - t["top2_logprob"]
    cases = pq.read_table(serial / "cases.parquet").to_pylist()
    predicted = {r["case_id"]: r.get("p_flip_pred") for r in cases}
    return tokens, gaps, predicted


def loaded_draws(repeated: Path, serial_composition: str = "c1") -> list[dict[str, Any]]:
    return [r for r in pq.read_table(repeated / "runs.parquet").to_pylist() if r["composition"] != serial_composition]


def analyse(serial: Path, repeated: Sequence[Path]) -> dict[str, Any]:
    ref, gaps, predicted = reference(serial)
    reach: dict[tuple[str, int], int] = defaultdict(int)
    broke: dict[tuple[str, int], int] = defaultdict(int)
    flipped = {d: defaultdict(int) for d in range(len(repeated))}
    draws = {d: defaultdict(int) for d in range(len(repeated))}
    for d, run in enumerate(repeated):
        for r in loaded_draws(run):
            case, tokens = r["case_id"], list(r["token_ids"])
            div = first_divergence(ref[case], tokens)
            draws[d][case] += 1
            flipped[d][case] += div is not None
            for step in range(len(ref[case]) if div is None else min(div + 1, len(ref[case]))):
                reach[(case, step)] += 1
            if div is not None and div < len(ref[case]):
                broke[(case, div)] += 1
    by_class: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, n in reach.items():
        by_class[gap_class(gaps[key])].append((broke[key], n))
    classes, rates = {}, {}
    for name, steps in by_class.items():
        b, n = sum(x for x, _ in steps), sum(y for _, y in steps)
        rate = rates[name] = b / n
        classes[name] = {"steps": len(steps), "reached": n, "broke": b, "rate": round(rate, 4),
                         "never_broke": sum(x == 0 for x, _ in steps),
                         "broke_in_half_or_more": sum(x / y >= 0.5 for x, y in steps),
                         "never_if_independent": round(sum((1 - rate) ** y for _, y in steps), 2)}
    cases = sorted(ref)
    observed = [sum(flipped[d][c] for d in flipped) / max(1, sum(draws[d][c] for d in draws)) for c in cases]
    labels = [o > 0 for o in observed]
    fitted = []
    for c in cases:  # the gap-only prediction, its rates fitted on these draws
        survive = 1.0
        for step in range(len(ref[c])):
            survive *= 1 - rates.get(gap_class(gaps[(c, step)]), 0.0)
        fitted.append(1 - survive)
    out: dict[str, Any] = {"cases": len(cases), "draws_per_case": [max(draws[d].values()) for d in draws],
                           "gap_classes": classes,
                           "gap_only_fitted": {"spearman": spearman(fitted, observed), "auroc": auroc(fitted, labels)}}
    if all(predicted.get(c) is not None for c in cases):
        p = [float(predicted[c]) for c in cases]  # type: ignore[arg-type]
        out["prediction"] = {"spearman": spearman(p, observed), "auroc": auroc(p, labels)}
    if len(repeated) >= 2:
        a = [flipped[0][c] / draws[0][c] for c in cases]
        b = [flipped[1][c] / draws[1][c] for c in cases]
        agree = sum((x > 0) == (y > 0) for x, y in zip(a, b))
        out["retest"] = {"spearman": spearman(a, b), "flipped_or_not_agree": agree}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("serial", type=Path)
    parser.add_argument("repeated", type=Path, nargs="+")
    args = parser.parse_args()
    print(json.dumps(analyse(args.serial, args.repeated), indent=1))


if __name__ == "__main__":
    main()
