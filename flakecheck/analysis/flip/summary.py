"""The `flip` block of meta.json: what was drawn, the noise that predicts, the agreement rates, the score over
the draws and the calibration of predicted against observed flip probabilities. Built from the analysed
rows, so a report reads it without the traces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flakecheck.analysis.flip.calibration import calibrate
from flakecheck.analysis.flip.observed import LEVEL, agreement_rates
from flakecheck.analysis.flip.predict import NoiseModel
from flakecheck.analysis.flip.score import score_distribution
from flakecheck.data.traces import run_label


def draw_labels(runs: Sequence[Mapping[str, Any]], draws: Sequence[str]) -> list[str]:
    """The run labels ('draw-03', 'c8 #2') of the draws' traces, in draw order then repeat."""
    keys = sorted({(int(r["repeat"]), str(r["composition"])) for r in runs if r["composition"] in draws},
                  key=lambda k: (k[0], list(draws).index(k[1])))
    return [run_label(c, r) for r, c in keys]


def flip_meta(cases: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], reference: str,
              draws: Sequence[str], noise: NoiseModel, sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    labels = draw_labels(runs, draws)
    outputs: dict[str, list[list[int]]] = {}
    verdicts: dict[str, dict[str, bool | None]] = {}
    for r in runs:
        label = run_label(str(r["composition"]), int(r["repeat"]))
        verdicts.setdefault(str(r["case_id"]), {})[label] = r["passed"]
        if r["composition"] in draws:
            outputs.setdefault(str(r["case_id"]), []).append(list(r["token_ids"]))
    block: dict[str, Any] = {"draws": list(draws), "n_draws": len(labels), "noise": noise.to_dict(),
                             "sampling": dict(sampling) if sampling else None,
                             # each case's p_flip_low / p_flip_high in cases.parquet
                             "interval": {"method": "clopper-pearson", "level": LEVEL}}
    if not labels:
        return block
    drawn_verdicts = {case: [by_label.get(label) for label in labels] for case, by_label in verdicts.items()}
    block["agreement"] = agreement_rates(outputs, drawn_verdicts)
    block["score"] = score_distribution(verdicts, labels, reference).to_dict()
    per_case = len(labels)
    block["calibration"] = calibrate([c.get("p_flip_pred") for c in cases], [c.get("p_flip") for c in cases],
                                     per_case)
    return block

