"""`flakecheck bench calibration`: how well the predicted flip probability matches the observed one, and what
the sampled compositions cost.

Two runs of the same demo cases (split-K kernels, SmolLM2, bf16, simulated replay) in one process: the six
default compositions, then the reference plus N compositions sampled from `--load` (`--sample N
--sample-only`). The second run's meta.json `flip` block gives the calibration of `p_flip_pred` against the
observed `p_flip`: `spearman`, `auroc` (for "flips in at least one draw"), `brier` (over the individual
draws), `top_shared` (cases sharing the top predicted value) and `observed_at_90` (cases flipping in >= 90%
of the draws), with the old risk score's AUROC and Spearman beside them. `cost_vs_default` is the sampled
run's wall time over the default run's (the machine's self-check done once before either is timed), the
replay times beside it; `rows` what each computed. Peak memory is the process's maximum
resident set (both runs, the model loaded once).
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.server_load import DEFAULT_LOAD
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, REFERENCE, Composition
from flakecheck.data.suite import load_suite
from flakecheck.engine import load_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.run.engine_source import run_suite

DEMO = Path(__file__).resolve().parents[2] / "suites" / "demo.jsonl"


def main(json_out: bool = False, quick: bool = False, limit: int | None = None, sample: int | None = None,
         load: str = DEFAULT_LOAD, seed: int = 0, model: str = "smollm2") -> dict[str, Any]:
    n_sample = sample or (4 if quick else 32)
    loaded = load_model(model, "bfloat16")
    suite = load_suite(DEMO).select(limit=limit or (4 if quick else None))
    max_tokens = 8 if quick else 64
    # the machine's self-check (minutes when its cache is cold) once, before either run is timed
    resolve_engine(EngineSettings(model), probe_dims(loaded.config))
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        default = run_suite(suite, model=loaded, kernels="splitk", compositions=list(DEFAULT_COMPOSITIONS),
                                       out=Path(tmp) / "default", html=False, max_tokens=max_tokens)
        seconds["default"] = time.perf_counter() - t0
        if not json_out:
            print(f"default   {seconds['default']:8.1f} s", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        sampled = run_suite(suite, model=loaded, kernels="splitk", compositions=[Composition(REFERENCE)],
                                       out=Path(tmp) / "sampled", html=False, max_tokens=max_tokens,
                                       sample=n_sample, load=load, sample_seed=seed)
        seconds["sampled"] = time.perf_counter() - t0
        if not json_out:
            print(f"sampled   {seconds['sampled']:8.1f} s", file=sys.stderr, flush=True)
    flip = sampled.meta["flip"]
    calibration = flip.get("calibration") or {}
    risk = flip.get("calibration_risk") or {}
    score = flip.get("score") or {}

    def rounded(value: Any, digits: int = 4) -> Any:
        return round(value, digits) if isinstance(value, float) else value

    result = {
        "bench": "calibration",
        "model": model,
        "kernels": "splitk",
        "cases": len(suite.cases),
        "sample": n_sample,
        "load": load,
        "seed": seed,
        **{key: rounded(calibration.get(key)) for key in ("spearman", "auroc", "brier", "brier_floor", "rate_mse",
                                                           "top_shared", "observed_at_90", "mean_predicted",
                                                           "mean_observed")},
        "risk_auroc": rounded(risk.get("auroc")),
        "risk_spearman": rounded(risk.get("spearman")),
        "risk_top_shared": risk.get("top_shared"),
        "cases_flipping": int((sampled.cases.p_flip > 0).sum()),
        "tar_r": rounded((flip.get("agreement") or {}).get("tar_r")),
        "score_mean": rounded(score.get("mean")),
        "score_std_pp": rounded(score.get("std_pp"), 2),
        "default_s": round(seconds["default"], 2),
        "sampled_s": round(seconds["sampled"], 2),
        "cost_vs_default": round(seconds["sampled"] / seconds["default"], 3),
        "replay_default_s": round(default.meta["timings"]["replay_s"], 2),
        "replay_sampled_s": round(sampled.meta["timings"]["replay_s"], 2),
        "rows_default": default.meta["replay_stats"].get("rows"),
        "rows_sampled": sampled.meta["replay_stats"].get("rows"),
        # computed rows are what the replay's time follows, and unlike wall time they do not depend on
        # what else the machine runs
        "rows_vs_default": _ratio(sampled.meta["replay_stats"].get("rows"), default.meta["replay_stats"].get("rows")),
        "noise": flip.get("noise"),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu": _cpu(),
    }
    print(json.dumps(result))
    return result


def _ratio(a: int | None, b: int | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
