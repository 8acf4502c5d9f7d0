"""The Python API the CLI is a thin layer over.

    run = flakecheck.run_suite("suites/demo.jsonl", kernels="splitk", limit=20)
    run.cases[run.cases.status != "stable"]
    flakecheck.load_run(run.path).runs

`run_suite` validates everything (suite, compositions, model, prompt lengths) before it writes
anything, replays the suite under every composition (each finished composition is saved under
partial/ at once, so Ctrl-C loses at most the composition in flight and `resume=True` continues),
then analyses the traces and writes the run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from flakecheck.analysis import Thresholds, analyse, run_label
from flakecheck.checks import check_label
from flakecheck.compositions import REFERENCE, Composition, order_compositions, resolve_compositions
from flakecheck.engine import LLMEngine, LoadedModel, decode_tokens, encode_prompt, load_model
from flakecheck.errors import UserError
from flakecheck.kernels import Ops, get_ops, resolve_backend
from flakecheck.progress import ReplayProgress
from flakecheck.replay import CaseRequest, Trace, replay
from flakecheck.rundir import (
    CASES_SCHEMA,
    RUNS_SCHEMA,
    TOKENS_SCHEMA,
    RunData,
    load_run,
    read_table,
    to_table,
    write_json,
    write_table,
)
from flakecheck.suite import Suite, check_prompt_lengths, load_suite

PARTIAL = "partial"


class RunInterrupted(Exception):
    """Ctrl-C during a run: finished compositions are saved; the message says how to resume."""


@dataclass
class RunPlan:
    """Everything a run needs, checked before the first byte is written."""

    suite: Suite
    compositions: list[Composition]
    model: LoadedModel
    ops: Ops
    settings: dict[str, Any]
    requests: list[CaseRequest]
    out: Path
    fingerprint: dict[str, Any] = field(default_factory=dict)


def run_suite(
    suite: str | Path | Suite,
    *,
    model: str | LoadedModel = "smollm2",
    dtype: str = "bfloat16",
    kernels: str = "splitk",
    backend: str = "auto",
    profile: str = "h100",
    compositions: Sequence[Composition] | None = None,
    max_tokens: int = 64,
    gap_threshold: float = 0.05,
    gap_window: int = 50,
    repeat: int = 1,
    limit: int | None = None,
    ids: Sequence[str] | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    html: bool = True,
    progress: bool = False,
    command: str | None = None,
) -> RunData:
    """Replay `suite` under each composition and write a run directory; returns it loaded."""
    started = time.perf_counter()
    plan = _plan(suite, model, dtype, kernels, backend, profile, compositions, max_tokens, gap_threshold,
                 gap_window, repeat, limit, ids, out, resume)
    plan.settings["command"] = command or _api_command(plan)
    load_s = time.perf_counter() - started
    traces, replay_s = _replay_all(plan, resume, progress)
    t0 = time.perf_counter()
    work = [(r, c) for r in range(repeat) for c in plan.compositions]
    with _interruptible(plan, work):
        tables = _analyse(plan, traces)
        analysis_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _write(plan, tables, {"load_s": load_s, "replay_s": replay_s, "analysis_s": analysis_s})
    run = load_run(plan.out)
    if html:
        from flakecheck.reports.html import write_html

        write_html(run, plan.out / "report.html")
    meta_path = plan.out / "meta.json"
    run.meta["timings"]["write_s"] = time.perf_counter() - t0
    run.meta["timings"]["total_s"] = time.perf_counter() - started
    write_json(meta_path, run.meta)
    return run


def _plan(suite, model, dtype, kernels, backend, profile, compositions, max_tokens, gap_threshold, gap_window,
          repeat, limit, ids, out, resume) -> RunPlan:
    for name, value, low in (("max_tokens", max_tokens, 1), ("gap_window", gap_window, 1), ("repeat", repeat, 1)):
        if not isinstance(value, int) or value < low:
            raise UserError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
    if not gap_threshold > 0:
        raise UserError(f"--gap-threshold must be > 0, got {gap_threshold!r}")
    suite_obj = suite if isinstance(suite, Suite) else load_suite(suite)
    suite_obj = suite_obj.select(list(ids) if ids else None, limit)
    comps = order_compositions(compositions) if compositions is not None else resolve_compositions(None, [])
    try:
        resolved_backend = resolve_backend(backend, "cpu")
        if resolved_backend == "triton" and not os.environ.get("TRITON_INTERPRET"):
            raise ValueError("the engine runs on the CPU, where the Triton kernels need TRITON_INTERPRET=1 "
                             "(slow; meant for small tests): use --backend torch or auto")
        ops = get_ops(kernels, backend, profile, "cpu")
    except (ValueError, ImportError) as exc:
        raise UserError(str(exc)) from exc
    loaded = model if isinstance(model, LoadedModel) else load_model(model, dtype)
    context = loaded.config.max_context
    prompt_ids = {case.id: encode_prompt(loaded, case.input) for case in suite_obj.cases}
    check_prompt_lengths(suite_obj, lambda case: len(prompt_ids[case.id]), context, max_tokens)
    for comp in comps:
        longest_filler = comp.fillers.prompt_len[1] + comp.fillers.output_len[1]
        if comp.fillers.count and longest_filler > context:
            raise UserError(f"composition '{comp.name}': fillers of up to {longest_filler} tokens exceed the "
                            f"model's context of {context}")
    requests = [CaseRequest(c.id, prompt_ids[c.id], c.max_tokens or max_tokens) for c in suite_obj.cases]
    out_dir = Path(out) if out is not None else _default_out(suite_obj.path)
    if resume and out is None:
        raise UserError("--resume needs --out DIR (the interrupted run directory)")
    settings = {
        "model": loaded.spec if isinstance(model, LoadedModel) else model,
        "model_path": str(loaded.path),
        "architecture": loaded.config.architecture,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "policy": kernels,
        "backend": resolved_backend,
        "profile": profile,
        "max_tokens": max_tokens,
        "repeat": repeat,
        "thresholds": {"gap_threshold": gap_threshold, "gap_window": gap_window},
    }
    plan = RunPlan(suite_obj, comps, loaded, ops, settings, requests, out_dir)
    # What decides the traces; thresholds only change the analysis, so a resume may change them.
    plan.fingerprint = {
        **{k: v for k, v in settings.items() if k not in ("thresholds", "model")},
        "suite_sha256": suite_obj.sha256,
        "case_ids": [r.case_id for r in requests],
        "compositions": [c.to_dict() for c in comps],
    }
    _prepare_out(plan, resume)
    return plan


def _default_out(suite_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path("reports") / f"{suite_path.stem}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _prepare_out(plan: RunPlan, resume: bool) -> None:
    partial = plan.out / PARTIAL
    fingerprint_file = partial / "fingerprint.json"
    if resume:
        if not fingerprint_file.is_file():
            raise UserError(f"{plan.out}: nothing to resume (no {PARTIAL}/fingerprint.json)")
        saved = json.loads(fingerprint_file.read_text())
        changed = sorted(k for k in set(saved) | set(plan.fingerprint) if saved.get(k) != plan.fingerprint.get(k))
        if changed:
            raise UserError(f"{plan.out}: cannot resume, the run's settings differ in: {', '.join(changed)}")
        return
    if plan.out.exists() and (not plan.out.is_dir() or any(plan.out.iterdir())):
        raise UserError(f"{plan.out}: already exists and is not empty (choose another --out, or --resume)")
    write_json(fingerprint_file, plan.fingerprint)


def _partial_path(plan: RunPlan, composition: Composition, repeat: int) -> Path:
    return plan.out / PARTIAL / f"{composition.name}.r{repeat}.parquet"


def _replay_all(plan: RunPlan, resume: bool, show_progress: bool) -> tuple[list[Trace], float]:
    engine = LLMEngine(plan.model, plan.ops)
    traces: list[Trace] = []
    work = [(r, c) for r in range(plan.settings["repeat"]) for c in plan.compositions]
    replay_s = 0.0
    with ReplayProgress(len(work) * len(plan.requests), enabled=show_progress) as bar:
        for repeat, composition in work:
            path = _partial_path(plan, composition, repeat)
            if resume and path.is_file():
                done = [Trace(**row) for row in read_table(path).to_dict("records")]
                bar.skip(run_label(composition.name, repeat), len(done))
                traces.extend(_as_lists(done))
                continue
            bar.start(run_label(composition.name, repeat))
            t0 = time.perf_counter()
            with _interruptible(plan, work):
                done = replay(engine, plan.requests, composition, repeat, on_case_done=bar.case_done)
                replay_s += time.perf_counter() - t0
                write_table(path, pa.Table.from_pylist([asdict(t) for t in done]))
            traces.extend(done)
    return traces, replay_s


@contextlib.contextmanager
def _interruptible(plan: RunPlan, work: list[tuple[int, Composition]]) -> Iterator[None]:
    """Ctrl-C becomes a RunInterrupted that says what was saved and how to continue."""
    try:
        yield
    except KeyboardInterrupt:
        finished = sum(_partial_path(plan, c, r).is_file() for r, c in work)
        raise RunInterrupted(
            f"interrupted: {finished} of {len(work)} compositions saved in {plan.out / PARTIAL}; "
            f"continue with: {_resume_command(plan)}"
        ) from None


def _as_lists(traces: list[Trace]) -> list[Trace]:
    """Parquet gives numpy arrays back; traces compare as lists."""
    return [Trace(t.case_id, t.composition, int(t.repeat), [int(x) for x in t.token_ids],
                  [int(x) for x in t.top1_ids], [float(x) for x in t.top1_logprobs], [int(x) for x in t.top2_ids],
                  [float(x) for x in t.top2_logprobs], t.finish_reason) for t in traces]


def _analyse(plan: RunPlan, traces: list[Trace]):
    tokenizer = plan.model.tokenizer
    texts: dict[int, str] = {}

    def token_text(token_id: int) -> str:
        if token_id not in texts:
            texts[token_id] = tokenizer.decode([token_id])
        return texts[token_id]

    thresholds = Thresholds(**plan.settings["thresholds"])
    reference = plan.compositions[0].name
    return analyse(traces, plan.suite.cases, reference, thresholds,
                   lambda ids: decode_tokens(plan.model, ids), token_text)


def _write(plan: RunPlan, tables, timings: dict[str, float]) -> None:
    write_table(plan.out / "runs.parquet", to_table(tables.runs, RUNS_SCHEMA))
    write_table(plan.out / "tokens.parquet", to_table(tables.tokens, TOKENS_SCHEMA))
    write_table(plan.out / "cases.parquet", to_table(tables.cases, CASES_SCHEMA))
    generated = sum(len(r["token_ids"]) for r in tables.runs)
    timings["generated_tokens"] = generated
    timings["tokens_per_s"] = generated / timings["replay_s"] if timings["replay_s"] else None
    meta = {
        **plan.settings,
        "suite": str(plan.suite.path),
        "suite_name": plan.suite.path.stem,
        "suite_sha256": plan.suite.sha256,
        "suite_warnings": plan.suite.warnings,
        "n_cases": len(plan.suite.cases),
        "compositions": [c.to_dict() for c in plan.compositions],
        "reference": plan.compositions[0].name,
        "versions": _versions(),
        "device": _device(),
        "timings": timings,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "status": "complete",
        "cases": [
            {"case_id": c.id, "input": c.input, "targets": list(c.targets),
             "checks": [check_label(k) for k in c.checks], "metadata": c.metadata, "line": c.line}
            for c in plan.suite.cases
        ],
    }
    write_json(plan.out / "meta.json", meta)
    shutil.rmtree(plan.out / PARTIAL, ignore_errors=True)


def _versions() -> dict[str, str | None]:
    import torch
    import transformers

    import flakecheck

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"flakecheck": flakecheck.__version__, "torch": torch.__version__, "triton": triton_version,
            "transformers": transformers.__version__, "python": platform.python_version()}


def _device() -> dict[str, Any]:
    import torch

    return {"type": "cpu", "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "platform": platform.platform()}


def _api_command(plan: RunPlan) -> str:
    s = plan.settings
    return (f"flakecheck run {shlex.quote(str(plan.suite.path))} --model {shlex.quote(str(s['model']))} "
            f"--dtype {s['dtype']} --kernels {s['policy']} --profile {s['profile']}")


def _resume_command(plan: RunPlan) -> str:
    command = plan.settings["command"]
    if "--resume" not in command:
        command += " --resume"
    if "--out" not in command:
        command += f" --out {shlex.quote(str(plan.out))}"
    return command


def run_from_cli(*, suite: Path, compositions_file: Path | None, composition_specs: list[str], ids: str | None,
                 quiet: bool, argv: list[str], **options: Any) -> None:
    """`flakecheck run`: the API call, a progress bar, then the terminal summary."""
    from rich.console import Console

    from flakecheck.reports.terminal import render_summary, summary_line

    compositions = resolve_compositions(compositions_file, composition_specs)
    id_list = [i.strip() for i in ids.split(",") if i.strip()] if ids else None
    command = shlex.join(["flakecheck", *argv[1:]])
    try:
        run = run_suite(suite, compositions=compositions, ids=id_list, progress=not quiet, command=command,
                        **options)
    except RunInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{exc}[/yellow]")
        sys.exit(130)
    if quiet:
        print(summary_line(run))  # one line whatever the terminal width: scripts grep it
    else:
        render_summary(run, Console())


__all__ = ["REFERENCE", "RunData", "RunInterrupted", "load_run", "run_suite"]
