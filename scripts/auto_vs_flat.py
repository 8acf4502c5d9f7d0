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

from flakecheck.analysis.flip.calibration import spearman


def observed(run: Path) -> dict[str, tuple[float, float, int]]:
    table = pq.read_table(run / "cases.parquet", columns=["case_id", "p_flip", "p_flip_low", "n_draws"]).to_pylist()
    return {r["case_id"]: (r["p_flip"], r["p_flip_low"], r["n_draws"]) for r in table if r["p_flip"] is not None}


def compare(a: dict[str, tuple[float, float, int]], b: dict[str, tuple[float, float, int]]) -> dict[str, float]:
    ids = [c for c in b if c in a]
    return {"cases": len(ids),
            "flipped_or_not_agreement": round(sum((a[c][0] > 0) == (b[c][0] > 0) for c in ids) / len(ids), 4),
            "gate10_agreement": round(sum((a[c][1] > 0.1) == (b[c][1] > 0.1) for c in ids) / len(ids), 4),
            "spearman": round(spearman([a[c][0] for c in ids], [b[c][0] for c in ids]), 4),
            "draws_mean": round(sum(a[c][2] for c in ids) / len(ids), 2),
            "flipped": sum(a[c][0] > 0 for c in ids), "flipped_in_flat": sum(b[c][0] > 0 for c in ids)}


def main() -> None:
    auto, flat, *retest = (Path(p) for p in sys.argv[1:])
    out = {"auto_vs_flat": compare(observed(auto), observed(flat))}
    if retest:
        out["retest_vs_flat"] = compare(observed(retest[0]), observed(flat))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
