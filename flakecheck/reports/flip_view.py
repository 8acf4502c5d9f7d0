"""What every report says about flip probability, from meta.json's `flip` block and the cases' columns: how
the compositions were drawn, the agreement rates, the score under that load, the calibration of predicted
against observed, and one case's observed (interval) and predicted probabilities as short text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from flakecheck.reports.svg import reliability_chart


@dataclass(frozen=True)
class FlipView:
    n_draws: int
    sampling: dict[str, Any] | None
    agreement: dict[str, Any]
    score: dict[str, Any]
    calibration: dict[str, Any] | None
    noise: dict[str, Any]
    n_flipping: int
    draws_per_case: tuple[int, int] = (0, 0)  # the fewest and the most draws a case got (they differ: --repeat auto)

    @classmethod
    def of(cls, block: dict[str, Any] | None, cases: list[dict[str, Any]]) -> FlipView | None:
        """The run record's flip block; None for a run without draws (or an older run directory)."""
        if not isinstance(block, dict) or not block.get("n_draws"):
            return None
        return cls(int(block["n_draws"]), block.get("sampling"), block.get("agreement") or {},
                   block.get("score") or {}, block.get("calibration"),
                   block.get("noise") or {}, sum(1 for c in cases if (c.get("p_flip") or 0) > 0),
                   _range([c.get("n_draws") for c in cases]))

    @property
    def source(self) -> str:
        """'32 compositions sampled from poisson:16 (seed 0)' or, for a probe, its draws."""
        fewest, most = self.draws_per_case
        if self.sampling:
            load = (self.sampling.get("load") or {}).get("spec", "?")
            each = f"; {fewest}–{most} a case, stopped once decided" if fewest != most else ""
            return f"{self.n_draws} compositions sampled from {load} (seed {self.sampling.get('seed')}{each})"
        if fewest != most:
            return (f"{fewest}–{most} draws a case (load levels × rounds; a case stopped once its interval was "
                    "decided)")
        return f"{self.n_draws} draws (load levels × repeats)"

    def lines(self) -> list[str]:
        """Plain text, one fact a line (terminal, markdown)."""
        n = self.n_draws
        out = [f"flip probability over {self.source}: {_cases(self.n_flipping)} flip in at least one draw; "
               f"TARr@{n} {_pct(self.agreement.get('tar_r'))}, TARa@{n} {_pct(self.agreement.get('tar_a'))} "
               f"(cases whose raw outputs / verdicts agree across every draw)"]
        s = self.score
        if s.get("mean") is not None:
            std = "—" if s.get("std_pp") is None else f"{s['std_pp']:.1f} pp"
            out.append(f"score under this load: mean {_pct(s['mean'])}, std {std}, 5th–95th percentile "
                       f"{_pct(s.get('p5'))}–{_pct(s.get('p95'))}, retry-free {_pct(s.get('retry_free'))} "
                       f"(passes under every draw); single-run score {_pct(s.get('single_run'))} (the reference)")
        c = self.calibration
        if c:
            line = (f"calibration of predicted vs observed ({c['n_cases']} cases): AUROC {_num(c.get('auroc'))} · "
                    f"Spearman {_num(c.get('spearman'))} · Brier {_num(c.get('brier'))} (a perfect prediction: "
                    f"{_num(c.get('brier_floor'))}) · mean predicted "
                    f"{_num(c.get('mean_predicted'))} vs observed {_num(c.get('mean_observed'))}; "
                    f"{_cases(c.get('top_shared'))} {_verb(c.get('top_shared'), 'share')} the top prediction, "
                    f"{_cases(c.get('observed_at_90'))} {_verb(c.get('observed_at_90'), 'flip')} in ≥ 90% of draws")
            out.append(line)
        return out

    def bins(self) -> list[dict[str, Any]]:
        return list((self.calibration or {}).get("bins") or [])

    def reliability_plot(self) -> Markup | None:
        bins = self.bins()
        return reliability_chart("reliability: predicted vs observed flip probability", bins) if bins else None


def prediction_note(block: dict[str, Any] | None) -> str | None:
    """Which noise the predicted flip probabilities come from, in one sentence (None for a run directory that
    does not say: older versions)."""
    source = (block or {}).get("noise_source") if isinstance(block, dict) else None
    if not isinstance(source, dict):
        return None
    noise = (block or {}).get("noise") or {}
    moved = _pct(noise.get("changed"))
    measured = f"{noise.get('n_shifts', 0)} gap shifts, {moved} of them moved (beyond fp32 rounding)"
    kind = source.get("source")
    if kind == "server":
        levels = source.get("levels") or []
        load = "the largest load it measured" if source.get("in_flight") is None else \
            f"{source['in_flight']} requests in flight"
        return (f"predicted flip probabilities use the server's own noise: the conformance profile of "
                f"{source.get('endpoint') or 'the server'} (version {source.get('server_version') or 'unknown'}), "
                f"for {load} ({', '.join(str(lv) for lv in levels) or 'no level'}): {measured}")
    if kind == "simulation":
        return (f"predicted flip probabilities describe the simulated {source.get('profile')} profile "
                f"({source.get('policy')} kernels, {measured}), not your server: measure the server with "
                "`flakecheck conformance --endpoint URL` and predict from its noise with "
                "`flakecheck probe --noise DIR`")
    return f"predicted flip probabilities use the noise this run measured between its compositions ({measured})"


def fmt_observed(case: dict[str, Any]) -> str:
    """'0.31 [0.18–0.49] n=16' (the share of draws that flipped, its 95% interval and the draws it is over: they
    differ between cases under `--repeat auto`), or '—'."""
    p = case.get("p_flip")
    if p is None:
        return "—"
    n = case.get("n_draws")
    draws = f" n={int(n)}" if isinstance(n, (int, float)) and n == n else ""
    return f"{p:.2f} [{case.get('p_flip_low') or 0:.2f}–{case.get('p_flip_high') or 0:.2f}]{draws}"


def fmt_predicted(case: dict[str, Any]) -> str:
    q = case.get("p_flip_pred")
    return "—" if q is None else f"{q:.2f}"


def _range(values: list[Any]) -> tuple[int, int]:
    counts = [int(v) for v in values if isinstance(v, (int, float)) and v == v]
    return (min(counts), max(counts)) if counts else (0, 0)


def _cases(n: Any) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"


def _verb(n: Any, verb: str) -> str:
    return f"{verb}s" if n == 1 else verb


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _num(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"
