"""Run directories from real runs of the tiny random model (its wide variant, whose K = 256 and 768
reductions are long enough for split-K to split), built once per test session.

Import the fixtures into a test module with `from tests.fixtures_runs import *  # noqa: F403`
(pytest finds fixtures by name in the module's namespace).

- `splitk_report_run`: the default compositions under split-K kernels, so some cases diverge;
  one prompt contains `<script>alert(1)</script>`, cases carry metadata and checks; with report.html.
- `invariant_report_run`: the same suite under fixed-order kernels: the gate's passing baseline.
- `loose_invariant_run` / `tight_invariant_run`: invariant runs on two compositions with a huge and
  a tiny near-tie threshold, so the same cases are fragile in one and stable in the other (the
  --fail-on-new-fragile fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.data.rundir import RunData
from flakecheck.engine import LoadedModel, load_model

SCRIPT_CASE = "xss"
SCRIPT_PROMPT = "Repeat this tag exactly: <script>alert(1)</script> and explain it."
PROMPTS = [
    ("capital", "What is the capital of France?", "Paris", "geo"),
    ("sum", "What is 17 + 25?", "42", "math"),
    ("colours", "Name three primary colours.", "red", "general"),
    ("haiku", "Write a haiku about the sea, the wind and the morning light.", "sea", "writing"),
    ("code", "Complete: def add(a, b):", "return", "code"),
    ("json", "Give the JSON for a person named Ada aged 36.", "Ada", "json"),
    ("letter", "Answer with a single letter: A, B, C or D. Which is a mammal?", "B", "choice"),
]


def write_report_suite(path: Path) -> Path:
    lines = []
    for i, (case_id, prompt, target, kind) in enumerate(PROMPTS):
        # prompts of different lengths make batch shapes, and so split counts, differ across compositions
        lines.append(json.dumps({
            "id": case_id, "input": [{"role": "user", "content": prompt * (1 + i % 3)}],
            "checks": [{"type": "icontains", "value": target}] if i % 2 == 0 else [{"type": "contains", "value": "a"}],
            "metadata": {"kind": kind, "difficulty": "easy" if i % 3 else "hard"},
        }))
    lines.append(json.dumps({"id": SCRIPT_CASE, "prompt": SCRIPT_PROMPT, "target": "<script>",
                             "metadata": {"kind": "<b>html</b>", "difficulty": "hard"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def report_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report_suite(tmp_path_factory.mktemp("report-suite") / "reportsuite.jsonl")


@pytest.fixture(scope="session")
def report_model(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def _run(model: LoadedModel, suite: Path, out: Path, kernels: str, **options) -> RunData:
    return flakecheck.run_suite(suite, model=model, kernels=kernels, max_tokens=8, out=out, **options)


@pytest.fixture(scope="session")
def splitk_report_run(report_model, report_suite, tmp_path_factory: pytest.TempPathFactory) -> RunData:
    return _run(report_model, report_suite, tmp_path_factory.mktemp("runs") / "splitk", "splitk", html=True)


@pytest.fixture(scope="session")
def invariant_report_run(report_model, report_suite, tmp_path_factory: pytest.TempPathFactory) -> RunData:
    return _run(report_model, report_suite, tmp_path_factory.mktemp("runs") / "invariant", "invariant", html=False)


TWO_COMPOSITIONS = [Composition("solo"), Composition("batch4", max_batch=4)]


@pytest.fixture(scope="session")
def loose_invariant_run(report_model, report_suite, tmp_path_factory: pytest.TempPathFactory) -> RunData:
    """Every step counts as a near-tie (threshold far above any gap): non-diverging cases are fragile."""
    return _run(report_model, report_suite, tmp_path_factory.mktemp("runs") / "loose", "invariant",
                compositions=TWO_COMPOSITIONS, gap_threshold=1e6, html=False)


@pytest.fixture(scope="session")
def tight_invariant_run(report_model, report_suite, tmp_path_factory: pytest.TempPathFactory) -> RunData:
    """No step counts as a near-tie: the same cases are stable."""
    return _run(report_model, report_suite, tmp_path_factory.mktemp("runs") / "tight", "invariant",
                compositions=TWO_COMPOSITIONS, gap_threshold=1e-12, html=False)
