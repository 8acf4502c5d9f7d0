"""`flakecheck run` on the command line: the settings from the options, the run with a progress bar, then the
terminal summary."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from flakecheck.data.compositions import resolve_compositions
from flakecheck.errors import UserError
from flakecheck.reports.finished import ReportError, show_finished_run
from flakecheck.run.engine_source import execute
from flakecheck.run.pipeline import RunInterrupted
from flakecheck.run.settings import RunConfig, parse_ids, parse_sample


def run_from_cli(suite: Path, *, model: str, dtype: str, kernels: str, backend: str, profile: str, device: str,
                 gpu_memory_utilization: float, compositions_file: Path | None, composition_specs: list[str],
                 max_tokens: int, gap_threshold: float,
                 gap_window: int, repeat: int, limit: int | None, ids: str | None, out: Path | None, resume: bool,
                 replay: str, input_format: str, html: bool, quiet: bool, grader: str | None, grader_timeout: float,
                 ray: str | None, workers: int, cpus_per_worker: int | None, allow_mixed_devices: bool,
                 sample: str, load: str, seed: int, sample_only: bool, tp: str = "1") -> None:
    compositions = resolve_compositions(compositions_file, composition_specs)
    draws, auto = parse_sample(sample)
    if sample_only:
        if not draws:
            raise UserError("--sample-only needs --sample N (the compositions to draw)")
        compositions = compositions[:1]  # the reference alone beside the draws
    config = RunConfig.parse(
        suite, model=model, dtype=dtype, kernels=kernels, backend=backend, profile=profile, device=device,
        gpu_memory_utilization=gpu_memory_utilization, compositions=compositions, max_tokens=max_tokens,
        gap_threshold=gap_threshold, gap_window=gap_window,
        repeat=repeat, limit=limit, ids=parse_ids(ids), replay=replay, out=out, html=html, input_format=input_format,
        grader=grader, grader_timeout=grader_timeout, ray=ray, workers=workers, cpus_per_worker=cpus_per_worker,
        allow_mixed_devices=allow_mixed_devices, sample="auto" if auto else draws, load=load, sample_seed=seed,
        sample_tp=tp)
    try:
        run = execute(config, resume=resume, progress=not quiet)
    except RunInterrupted as exc:
        Console(stderr=True).print(f"[yellow]{exc}[/yellow]")
        sys.exit(130)
    except ReportError as exc:
        show_finished_run(exc.run, quiet, exc)
    else:
        show_finished_run(run, quiet)
