"""How an adaptive run (`run --sample auto`) agrees with a flat one (`run --sample 32`), from their cases.parquet.

    .venv/bin/python scripts/auto_vs_flat.py AUTO_DIR FLAT_DIR [RETEST_DIR]

Prints one JSON line: over the cases both measured, the share with the same flipped-or-not decision (a flip in
at least one draw), the share with the same gate decision at 10% (the exact interval's lower bound above it),
the Spearman correlation of the observed flip rates, and the draws each side spent. With RETEST_DIR (a second
flat run, another seed) the same figures for the retest against FLAT_DIR: how well a flat pass agrees with
itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
from adaptive_heldout import Counts, agreement  # this directory: the held-out comparison's own decisions


def observed(run: Path) -> Counts:
    """Each case's (flips, draws) from a run directory's cases.parquet (the cases with draws)."""
    rows = pq.read_table(run / "cases.parquet", columns=["case_id", "p_flip", "n_draws"]).to_pylist()
    return {r["case_id"]: (round(r["p_flip"] * r["n_draws"]), int(r["n_draws"]))
            for r in rows if r["p_flip"] is not None}


def compare(a: Counts, b: Counts) -> dict[str, float]:
    common = {c: b[c] for c in b if c in a}
    return {"cases": len(common), **{k: round(v, 4) for k, v in agreement(a, common).items()},
            "draws_mean": round(sum(a[c][1] for c in common) / len(common), 2),
            "flipped": sum(a[c][0] > 0 for c in common), "flipped_in_flat": sum(k > 0 for k, _ in common.values())}


def main() -> None:
    auto, flat, *retest = (Path(p) for p in sys.argv[1:])
    out = {"auto_vs_flat": compare(observed(auto), observed(flat))}
    if retest:
        out["retest_vs_flat"] = compare(observed(retest[0]), observed(flat))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
