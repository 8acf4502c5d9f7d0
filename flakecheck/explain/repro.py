"""`flakecheck repro RUN_DIR CASE_ID`: a small self-contained directory that reproduces one case's flip.

    suite.jsonl         the case's suite line, and its batch-mates' when the divergent composition batches
                        or shares a prefix cache (every case of the run then: arrival order, fillers and
                        batch shapes depend on all of them); lines exactly as the suite had them
    compositions.jsonl  the reference and the divergent composition, every field (fillers with their seeds)
    repro.py            runs `flakecheck run` on those two files with the run's settings, then checks the new
                        run's first divergence step and token pair for the case: exit 0 when it reproduces,
                        1 when not
    expected.json       what the run recorded (step, token ids and texts, the run's settings)
    README.txt          what this is, how to run it, and the `flakecheck probe` command that offers the same
                        load to a server

The directory is written under a temporary name and renamed into place: never half-written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from flakecheck.data.compositions import AXES, Composition
from flakecheck.data.rundir import write_json
from flakecheck.data.suite import Case
from flakecheck.data.traces import run_label
from flakecheck.errors import UserError
from flakecheck.explain.source import Divergence, RunSource, open_run

SUITE, COMPOSITIONS, SCRIPT, EXPECTED, README = (
    "suite.jsonl", "compositions.jsonl", "repro.py", "expected.json", "README.txt")

SCRIPT_TEXT = '''#!/usr/bin/env python3
"""Reproduce one flip recorded by flakecheck: replay the case under its reference and divergent composition
with the run's settings, then check the first divergence. Exit 0: reproduced; 1: not; 2: the replay failed."""

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = json.loads((HERE / "expected.json").read_text())


def main() -> int:
    out = HERE / "runs" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    argv = [*EXPECTED["run_argv"], "--out", str(out)]
    print("replaying:", " ".join(argv), flush=True)
    # the flakecheck of this Python (a virtual environment's python runs its own flakecheck)
    runner = [sys.executable, "-c", "import sys; from flakecheck.cli import main; sys.argv[0] = 'flakecheck'; main()"]
    if subprocess.run(runner + argv[1:], cwd=HERE).returncode != 0:
        print("the replay failed (see above)", file=sys.stderr)
        return 2
    from flakecheck import load_run
    from flakecheck.analysis.divergence import first_divergence

    runs = load_run(out).runs
    case = runs[runs["case_id"] == EXPECTED["case_id"]]
    ref = case[(case["composition"] == EXPECTED["reference"]) & (case["repeat"] == 0)].iloc[0]
    alt = case[(case["composition"] == EXPECTED["composition"]) & (case["repeat"] == EXPECTED["repeat"])].iloc[0]
    ref_ids, alt_ids = [int(t) for t in ref["token_ids"]], [int(t) for t in alt["token_ids"]]
    step = first_divergence(ref_ids, alt_ids)
    pair = (None, None) if step is None else (
        ref_ids[step] if step < len(ref_ids) else None, alt_ids[step] if step < len(alt_ids) else None)
    want = (EXPECTED["ref_token_id"], EXPECTED["alt_token_id"])
    label = EXPECTED["label"]
    if step == EXPECTED["step"] and pair == want:
        print(f"reproduced: {EXPECTED['case_id']} diverges at step {step} under {label} "
              f"({EXPECTED['ref_token']!r} -> {EXPECTED['alt_token']!r}); run directory {out}")
        return 0
    print(f"NOT reproduced: {EXPECTED['case_id']} under {label}: first divergence {step} (token ids {pair}), "
          f"expected step {EXPECTED['step']} (token ids {want}); run directory {out}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''


def write_repro(run_dir: str | Path, case_id: str, out: str | Path | None = None,
                suite: str | Path | None = None) -> Path:
    """Write the repro directory of one diverged case; returns its path. UserError (exit 2) when the case did
    not diverge, is unknown, or `out` exists and is not empty."""
    source = open_run(run_dir, suite)
    statuses = dict(zip(source.run.cases["case_id"].astype(str), source.run.cases["status"]))
    if case_id not in statuses:
        raise UserError(f"{case_id!r} is not a case of the run {source.run.path}")
    found = source.divergences((case_id,))
    if not found:
        raise UserError(f"{case_id!r} did not diverge in {source.run.path} (status {statuses[case_id]}): "
                        "nothing to reproduce")
    divergence = found[0]
    target = Path(out) if out is not None else source.run.path / "repro" / re.sub(r"[^A-Za-z0-9_.-]", "_", case_id)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"{target}: already exists and is not empty (choose another --out)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _fill(staging, source, divergence)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _fill(path: Path, source: RunSource, d: Divergence) -> None:
    reference = source.reference
    case_ids = needed_cases(d.composition, d.case_id, [c.id for c in source.suite.cases])
    lines = source.suite.path.read_text(encoding="utf-8-sig").split("\n")
    by_id = {c.id: c for c in source.suite.cases}
    (path / SUITE).write_text("".join(_suite_line(lines, by_id[i]) + "\n" for i in case_ids), encoding="utf-8")
    (path / COMPOSITIONS).write_text("".join(json.dumps(c.to_dict()) + "\n" for c in (reference, d.composition)))
    config = source.config.with_changes(
        suite=Path(SUITE), named=(reference, d.composition), sampling=None, repeat=d.repeat + 1, ids=(), limit=None,
        out=None, html=False, grader=(), engine=replace(source.config.engine, model=_model_spec(source)))
    argv = _without_compositions(config.argv()) + ["--compositions", COMPOSITIONS, "--quiet"]
    texts = source.run.cases.set_index("case_id").loc[d.case_id]
    expected = {
        "case_id": d.case_id, "step": d.step, "reference": reference.name, "composition": d.composition.name,
        "repeat": d.repeat, "label": run_label(d.composition.name, d.repeat), "ref_token_id": d.ref_token,
        "alt_token_id": d.alt_token, "ref_token": _text(texts.get("ref_token")),
        "alt_token": _text(texts.get("alt_token")), "run_dir": str(source.run.path.resolve()), "run_argv": argv,
        "cases_in_suite": len(case_ids),
    }
    write_json(path / EXPECTED, expected)
    script = path / SCRIPT
    script.write_text(SCRIPT_TEXT)
    script.chmod(0o755)
    (path / README).write_text(_readme(source, d, expected, probe_command(source, d)))


def needed_cases(composition: Composition, case_id: str, all_ids: list[str]) -> list[str]:
    """The suite lines a composition needs to replay a case as the run did: the case alone when it is serial
    without a prefix cache (nothing else shares its steps); else every case of the run, in order (batch-mates,
    arrival order, fillers and prefix-cache contents all depend on them)."""
    if composition.cases_alone:
        return [case_id]
    return list(all_ids)


def _suite_line(lines: list[str], case: Case) -> str:
    """The case's line as the suite file has it; a line without an id gets the id the run gave it (its position
    in the suite numbered it, and that position changes here)."""
    raw = lines[case.line - 1].strip()
    obj = json.loads(raw)
    if obj.get("id") is None:
        return json.dumps({"id": case.id, **obj}, ensure_ascii=False)
    return raw


def _model_spec(source: RunSource) -> str:
    """The model as the run named it; a local path made absolute, so the script runs from anywhere."""
    spec = source.config.engine.model
    return str(Path(spec).resolve()) if Path(spec).exists() else spec


def _without_compositions(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--composition":
            skip = True
        else:
            kept.append(arg)
    return kept


def probe_command(source: RunSource, d: Divergence, endpoint: str = "http://127.0.0.1:8000") -> str:
    """`flakecheck probe` offering a server the same load: serial requests as the reference, then the divergent
    composition's concurrency, fillers and what each axis asks (prefix reuse; chunked prefill is the server's own
    setting, which the README states)."""
    c = d.composition
    argv = ["flakecheck", "probe", SUITE, "--endpoint", endpoint, "--concurrency",
            "1" if c.max_batch == 1 else f"1,{c.max_batch}", "--max-tokens", str(source.config.max_tokens),
            "--dtype", source.config.engine.dtype]
    if c.fillers.count:
        argv += ["--fillers", str(c.fillers.count)]
    for axis in AXES:  # what each composition axis asks of the server (flakecheck/data/axes/)
        argv += axis.probe_args(c)
    if d.repeat:
        argv += ["--repeat", str(d.repeat + 1)]
    return shlex.join(argv)


def _text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and value != value) else str(value)


def _readme(source: RunSource, d: Divergence, expected: dict[str, Any], probe: str) -> str:
    notes = "".join(axis.repro_note(d.composition) for axis in AXES)  # the server settings an axis needs
    return f"""Reproduce flakecheck's flip of case {d.case_id!r}
{'=' * (34 + len(d.case_id))}

Recorded in {source.run.path.resolve()}: under composition {expected['label']!r} the case first diverges from the
reference {source.reference.name!r} at generated token {d.step}: {expected['ref_token']!r} (reference) ->
{expected['alt_token']!r} ({expected['label']}). Model {source.config.engine.model}, {source.config.engine.dtype},
kernels {source.config.policy.name}.

Run (from any directory; needs flakecheck installed, e.g. its virtual environment's python):

    python3 repro.py

It replays {SUITE} ({expected['cases_in_suite']} case(s): the case{'' if expected['cases_in_suite'] == 1 else
' and its batch-mates'}) under the two compositions of {COMPOSITIONS} with the run's settings:

    {shlex.join(expected['run_argv'])} --out runs/<time>

and checks the new run's first divergence: exit 0 when it is at step {d.step} with the same token pair, 1 when not
(2 when the replay itself failed). Each attempt's run directory stays under runs/.

The same load offered to a server (an OpenAI-compatible endpoint; set --endpoint):

    {probe}
{notes}"""
