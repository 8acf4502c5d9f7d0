"""`probe --repeat auto` against flat `--repeat 8` on held-out material (issue 39's goals), two ways:

1. the stopping rule alone, against a fake draw source with known per-case flip probabilities (many seeds);
2. the whole probe over HTTP against the fake server of tests/probe_fakes.py in its chance mode (a prompt
   saying chance=P flips in a share P of its requests at load): two flat `--concurrency 1,8 --repeat 8`
   passes and one `--repeat auto` pass of the same cases, every request the server received counted.

The material: per-case flip probabilities from two generators, fixed before any measurement; the rule's
defaults (threshold 10%, 4 rounds a case on average, 8 at most) were set before either was drawn. The
development seeds 0–19 of generator "mixed" were looked at while writing the rule; the figures here use
seeds from 1000 on, and generator "u-shaped" was never run before.

Run from the repository root: .venv/bin/python scripts/adaptive_heldout.py [--http-cases 48]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from flakecheck.analysis.flip.adaptive import AutoDraws, measure
from flakecheck.analysis.flip.calibration import spearman
from flakecheck.analysis.flip.observed import exact_interval

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/probe_fakes.py: the fake server

# (true flip probability, has a near-tie the noise can close) per case
Material = list[tuple[float, bool]]


def mixed(rng: random.Random, n: int) -> Material:
    """40% never flip (a fifth of them with a near-tie all the same), 60% flip with p uniform on 0.02–0.95."""
    out = []
    for _ in range(n):
        if rng.random() < 0.4:
            out.append((0.0, rng.random() < 0.2))
        else:
            out.append((rng.uniform(0.02, 0.95), True))
    return out


def u_shaped(rng: random.Random, n: int) -> Material:
    """30% never flip (no near-tie), 70% flip with p ~ Beta(0.5, 0.5): most near 0 or near 1."""
    return [(0.0, False) if rng.random() < 0.3 else (rng.betavariate(0.5, 0.5), True) for _ in range(n)]


GENERATORS: dict[str, Callable[[random.Random, int], Material]] = {"mixed": mixed, "u-shaped": u_shaped}


Counts = dict[str, tuple[int, int]]  # case -> (flips, draws)


def ceiling(material: Material, flat_draws: int = 8) -> float:
    """The most any procedure can agree with one flat pass on flipped-or-not, in expectation: a case flipping
    with probability p shows a flip in that pass with q = 1 - (1 - p)^N, independently of whatever the other
    procedure drew, so the best it can do is say the likelier outcome, right with max(q, 1 - q) — even knowing
    p exactly."""
    qs = [1 - (1 - p) ** flat_draws for p, _ in material]
    return sum(max(q, 1 - q) for q in qs) / len(qs)


def agreement(a: Counts, b: Counts) -> dict[str, float]:
    """Over b's cases: the share with the same decision — flipped at least once, and the gate's at 10% (the
    exact interval's lower bound above it) — and the rank correlation of the rates."""
    ids = list(b)

    def flipped(k: int, n: int) -> bool:
        return k > 0

    def gated(k: int, n: int) -> bool:
        return exact_interval(k, n)[0] > 0.1

    def agree(decide: Callable[[int, int], bool]) -> float:
        return sum(decide(*a[c]) == decide(*b[c]) for c in ids) / len(ids)

    return {"agreement": agree(flipped), "gate_agreement": agree(gated),
            "spearman": spearman([a[c][0] / a[c][1] for c in ids], [b[c][0] / b[c][1] for c in ids])}


def compare(auto: Counts, flat: Counts, retest: Counts) -> dict[str, float | None]:
    """Against the first flat pass: `agreement` of auto; the same for a second flat pass (the retest), which is
    what a flat pass agrees with itself."""
    return {**agreement(auto, flat), **{f"{k}_retest": v for k, v in agreement(retest, flat).items()}}


def rule_alone(generator: str, seeds: range, n_cases: int) -> dict[str, object]:
    target = AutoDraws()
    rows = []
    for seed in seeds:
        rng = random.Random(seed)
        material = GENERATORS[generator](rng, n_cases)
        truth = {f"c{i}": p for i, (p, _) in enumerate(material)}
        # the noise prediction: 0 exactly where no near-tie is within the noise (the probe measures it)
        predicted = {f"c{i}": (0.2 if tie else 0.0) for i, (_, tie) in enumerate(material)}

        def flat_pass(rng: random.Random = rng, truth: dict[str, float] = truth) -> Counts:
            return {c: (sum(rng.random() < p for _ in range(8)), 8) for c, p in truth.items()}

        def draw(case: str, rng: random.Random = rng, truth: dict[str, float] = truth) -> bool:
            return rng.random() < truth[case]

        flat, retest = flat_pass(), flat_pass()
        result = measure(list(truth), draw, predicted, target)
        auto = {c: (s.flips, s.draws) for c, s in result.items()}
        # requests: flat sends every case 8 times at c1 and at c8; auto the serial reference once and its draws
        requests = (n_cases + sum(s.draws for s in result.values())) / (16 * n_cases)
        rows.append({**compare(auto, flat, retest), "requests": requests, "agreement_ceiling": ceiling(material)})
    return {k: {"mean": statistics.mean(r[k] for r in rows), "min": min(r[k] for r in rows),
                "max": max(r[k] for r in rows)} for k in rows[0]} | {"seeds": [seeds.start, seeds.stop - 1],
                                                                     "cases": n_cases}


def over_http(generator: str, seed: int, n_cases: int) -> dict[str, object]:
    from flakecheck.probe import ProbeConfig, probe_suite
    from tests.probe_fakes import Behaviour, Record, ThreadedServer, make_app

    material = GENERATORS[generator](random.Random(seed), n_cases)
    work = Path(tempfile.mkdtemp(prefix="adaptive-heldout-"))
    suite = work / "suite.jsonl"
    # chance=0.0001: a near-tie the noise can close that, in practice, never flips
    lines = [json.dumps({"id": f"h{i}", "prompt": f"Case {i}: chance={p if p or not tie else 0.0001:.4f} go",
                         "max_tokens": 4}) for i, (p, tie) in enumerate(material)]
    suite.write_text("\n".join(lines) + "\n")
    behaviour, record = Behaviour(chances=random.Random(seed + 1), step_delay_s=0.001), Record()
    observed, sent = {}, {}
    with ThreadedServer(make_app(behaviour, record)) as server:
        for name, auto in (("flat", None), ("retest", None), ("auto", AutoDraws())):
            before = len(record.bodies)
            run = probe_suite(ProbeConfig(suite, server.url, out=work / name, html=False, concurrency=(1, 8),
                                          repeat=8, auto=auto))
            sent[name] = len(record.bodies) - before
            observed[name] = {str(r.case_id): (round(r.p_flip * r.n_draws), int(r.n_draws))
                              for r in run.cases.itertuples()}
            if auto is not None:
                sent["auto_case_requests"] = len(run.runs)
                sent["auto_fillers"] = sent[name] - len(run.runs)
    return {**compare(observed["auto"], observed["flat"], observed["retest"]), "requests": sent,
            "agreement_ceiling": ceiling(material),
            "requests_share": sent["auto"] / sent["flat"], "cases": n_cases, "seed": seed, "generator": generator,
            "flipping_in_flat": sum(k > 0 for k, _ in observed["flat"].values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-cases", type=int, default=48)
    parser.add_argument("--http-seeds", type=int, default=1, help="seeds per generator over HTTP (from 2000, 3000)")
    parser.add_argument("--skip-rule", action="store_true")
    args = parser.parse_args()
    if not args.skip_rule:
        for generator in GENERATORS:
            print(json.dumps({"rule_alone": generator, **rule_alone(generator, range(1000, 1050), 100)}), flush=True)
    for generator, first in (("mixed", 2000), ("u-shaped", 3000)):
        for seed in range(first, first + args.http_seeds):
            print(json.dumps({"over_http": True, **over_http(generator, seed, args.http_cases)}), flush=True)


if __name__ == "__main__":
    main()
