"""`flakecheck explain RUN_DIR`: which mechanism flipped each diverged case, and the smallest fix, priced.

    run = flakecheck.explain_run("reports/demo-splitk")
    run.attribution[run.attribution.reproduces]      # which mechanisms alone reproduce each flip
    run.fixes.sort_values("rank")                     # the candidate fixes, cheapest full fix first

Reopen the run (settings, suite, recorded tokens) -> replay each diverged case's mechanism pairs up to its
first divergence + `steps_after` (one lockstep; flakecheck.explain.mechanisms) -> replay the flaky cases under
each candidate fix (a second lockstep, full length; flakecheck.explain.fixes) -> time each fix's cost
(flakecheck.explain.costs) -> write attribution.parquet, fixes.parquet and explain.json into the run
directory (RunDirectory.write_explain) and render report.html again if the run has one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from flakecheck.analysis.attribution import case_summary
from flakecheck.analysis.verdicts import memo_decode
from flakecheck.data.rundir import RunData, RunDirectory, with_explanation
from flakecheck.engine import LoadedModel, build_model, decode_tokens, token_texts
from flakecheck.engine.models import CausalLM, probe_dims
from flakecheck.engine.spec import resolve_engine
from flakecheck.errors import UserError
from flakecheck.explain.costs import measure_costs
from flakecheck.explain.fixes import evaluate_fixes, fix_rows, plan_fixes
from flakecheck.explain.mechanisms import Pair, attribution_row, compare, pairs
from flakecheck.explain.source import Divergence, RunSource, open_run, with_requests
from flakecheck.explain.targeted import Replays, Variant
from flakecheck.grading.external import DEFAULT_TIMEOUT_S, GraderSpec, grader_spec
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.replay.cluster import Cluster, ClusterSettings
from flakecheck.reports.html import write_html

DEFAULT_STEPS_AFTER = 4


def explain_run(run_dir: str | Path, *, ids: Sequence[str] = (), steps_after: int = DEFAULT_STEPS_AFTER,
                grader: str | Sequence[str] | None = None, grader_timeout: float = DEFAULT_TIMEOUT_S,
                suite: str | Path | None = None, fixes: bool = True, model: LoadedModel | None = None,
                progress: bool = False, cost_repeats: int = 3, ray: str | None = None, workers: int = 2,
                cpus_per_worker: int | None = None, allow_mixed_devices: bool = False,
                device: str | None = None) -> RunData:
    """Explain the diverged cases of a run directory (those of `ids`, when given) and write what was found
    into it; returns the run loaded again, with `attribution`, `fixes` and `explain` set.

    `grader` grades the fixed outputs (default: the grader the run used, else the suite's checks); `suite`
    points at the run's suite file when it moved; `fixes=False` skips the fix list and its costs. `ray` runs
    the targeted replays in shards on a Ray cluster ("local", "auto" or an address; see `run_suite`); the
    fixes' cost timings stay on this machine, whose engine they price. `device` replays on another device than
    the run's (auto, cpu, cuda:N): a run made on a GPU explained on a CPU, say."""
    started = time.perf_counter()
    if isinstance(steps_after, bool) or not isinstance(steps_after, int) or steps_after < 0:
        raise UserError(f"--steps-after must be an integer >= 0, got {steps_after!r}")
    source = open_run(run_dir, suite, device)
    spec = _grader(source, grader, grader_timeout)
    divergences = source.divergences(tuple(ids))
    info: dict[str, Any] = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "steps_after": steps_after,
        "ids": list(ids), "n_explained": len(divergences), "grader": spec.to_dict() if spec else None,
        "priced_fixes": fixes and bool(divergences), "cases": {}, "replays": {},
    }
    timings: dict[str, float | None] = {"run_replay_s": (source.run.meta.get("timings") or {}).get("replay_s")}
    attribution: list[dict[str, Any]] = []
    fix_table: list[dict[str, Any]] | None = None
    if divergences:
        t0 = time.perf_counter()
        loaded = model if model is not None else source.config.engine.load()
        with_requests(source, loaded)
        mechanism_pairs = {d.case_id: pairs(d, source.reference, source.policy, source.moe) for d in divergences}
        explain_replays, fix_replays = Replays(source), Replays(source)
        for d in divergences:
            for pair in mechanism_pairs[d.case_id]:
                if pair.a is not None and pair.b is not None:
                    explain_replays.need(pair.a, d.case_id, d.step + steps_after + 1)
                    explain_replays.need(pair.b, d.case_id, d.step + steps_after + 1)
        if fixes:
            plan_fixes(source, divergences, fix_replays)
        network = _network(source, loaded, [explain_replays, fix_replays])
        timings["load_s"] = time.perf_counter() - t0
        cluster = None
        if ray is not None:
            # unreachable: exit 2 before anything is written (explain writes only at the end)
            cluster = _cluster(source, [explain_replays, fix_replays],
                               ClusterSettings(ray, workers, cpus_per_worker, allow_mixed_devices))
        try:
            info["replays"]["attribution"] = vars(explain_replays.run(loaded, network, progress, cluster))
            timings["attribution_s"] = info["replays"]["attribution"]["seconds"]
            attribution = _attribution(source, divergences, mechanism_pairs, explain_replays, steps_after, loaded)
            info["cases"] = _summaries(divergences, attribution, source)
            if fixes:
                fix_table = _price_fixes(source, divergences, fix_replays, loaded, network, spec, cost_repeats, info,
                                         timings, progress, cluster)
        finally:
            if cluster is not None:
                cluster.stop()  # nothing left running, whatever happened
    timings["total_s"] = time.perf_counter() - started
    if timings.get("attribution_s") is not None and timings["run_replay_s"]:
        timings["attribution_vs_run"] = timings["attribution_s"] / timings["run_replay_s"]
    info["timings"] = timings
    directory = RunDirectory(run_dir)
    directory.write_explain(attribution, fix_table, info)
    run = with_explanation(source.run)
    if directory.html_path.is_file():
        write_html(run, directory.html_path)
    return run


def _price_fixes(source: RunSource, divergences: list[Divergence], replays: Replays, model: LoadedModel,
                 network: CausalLM, grader: GraderSpec | None, cost_repeats: int, info: dict[str, Any],
                 timings: dict[str, float | None], progress: bool, cluster: Cluster | None) -> list[dict[str, Any]]:
    """Replay the fixes (`replays` holds them), grade what they give, time what they cost, rank them."""
    info["replays"]["fixes"] = vars(replays.run(model, network, progress, cluster))
    timings["fixes_s"] = info["replays"]["fixes"]["seconds"]
    results = evaluate_fixes(source, divergences, replays, memo_decode(lambda ids: decode_tokens(model, ids)), grader)
    t0 = time.perf_counter()
    costs = measure_costs(source, model, network, cost_repeats)
    timings["costs_s"] = time.perf_counter() - t0
    return fix_rows(results, divergences, costs)


def _grader(source: RunSource, grader: str | Sequence[str] | None, timeout: float) -> GraderSpec | None:
    """--grader when given (checked before anything runs), else the grader the run used, else None (checks)."""
    if grader:
        return grader_spec(grader, timeout)
    if source.config.grader:
        return GraderSpec(source.config.grader, source.config.grader_timeout)
    return None


def _other_policies(source: RunSource, replays: list[Replays]) -> list[KernelPolicy]:
    """The policies other than the run's that some replay plans with, in a stable order."""
    others = {variant.policy for r in replays for variant, _ in r.wanted.values()} - {source.policy}
    return sorted(others, key=lambda p: p.name)


def _cluster(source: RunSource, replays: list[Replays], settings: ClusterSettings) -> Cluster:
    """Actors that build the run's engine with every other policy the replays plan with."""
    cluster = Cluster(settings, source.config.engine, tuple(_other_policies(source, replays)))
    cluster.start()
    return cluster


def _network(source: RunSource, model: LoadedModel, replays: list[Replays]) -> CausalLM:
    """The run's kernels on the model, on the paths this machine verified (explain replays here, perhaps on
    another machine than the run's), its weights prepared for every other policy a replay plans with."""
    others = tuple(_other_policies(source, replays))
    spec = resolve_engine(source.config.engine, probe_dims(model.config), also=others)
    recorded = (source.run.meta.get("engine") or {}).get("machine")
    if recorded and recorded != spec.machine.to_dict():
        Console(stderr=True).print(f"[yellow]warning: explain replays on {spec.machine.describe()}, not on the "
                                   "machine that made the run: a replay can differ from the recorded tokens[/yellow]")
    return build_model(model, spec.ops(also_plans=others))


def _attribution(source: RunSource, divergences: list[Divergence], mechanism_pairs: dict[str, list[Pair]],
                 replays: Replays, steps_after: int, model: LoadedModel) -> list[dict[str, Any]]:
    """attribution.parquet's rows: every mechanism of every case, its pair's tokens compared in the window."""
    token_text = token_texts(model)
    rows = []
    for d in divergences:
        window = d.step + steps_after + 1
        for pair in mechanism_pairs[d.case_id]:
            if pair.a is None or pair.b is None:
                rows.append(attribution_row(d, pair, window, None, None, token_text))
                continue
            outcome = compare(replays.tokens(pair.a, d.case_id, window), replays.tokens(pair.b, d.case_id, window))
            labels = (pair.a.label(source.policy), pair.b.label(source.policy))
            rows.append(attribution_row(d, pair, window, outcome, labels, token_text))
    return rows


def _summaries(divergences: list[Divergence], rows: list[dict[str, Any]], source: RunSource) -> dict[str, Any]:
    by_case: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(str(row["case_id"]), []).append(row)
    return {d.case_id: {**case_summary(by_case[d.case_id]), "step": d.step,
                        "composition": Variant(d.composition, d.repeat, source.policy).label(source.policy)}
            for d in divergences}
