"""The GitHub Action (action.yml): what GitHub would run cannot run here, so its YAML is checked for the structure
a composite action needs and for agreement with its script, and its run-and-gate step, scripts/action.sh, runs
here as the action runs it (inputs as FLK_* variables, $GITHUB_OUTPUT and $GITHUB_STEP_SUMMARY files)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
SCRIPT = ROOT / "scripts" / "action.sh"
CONFIG = """\
prompts: ["{{question}}"]
tests:
  - description: sea
    vars: {question: Tell me about the sea.}
    assert: [{type: icontains, value: e}]
  - description: wind
    vars: {question: A haiku about wind.}
    assert: [{type: llm-rubric, value: is a haiku}]
  - description: never
    vars: {question: Say nothing.}
    assert: [{type: contains, value: "no model writes this: 7f3a9c"}]
"""


def test_action_yml_is_a_composite_action_whose_steps_agree_with_its_script() -> None:
    assert ACTION["name"] and ACTION["description"]
    assert ACTION["runs"]["using"] == "composite"
    inputs = ACTION["inputs"]
    assert inputs["suite"]["required"] is True
    assert all(spec.get("description") for spec in inputs.values())
    text = (ROOT / "action.yml").read_text()
    assert set(re.findall(r"inputs\.([a-z-]+)", text)) <= set(inputs)  # no input used but undeclared
    steps = ACTION["runs"]["steps"]
    for step in steps:
        assert ("uses" in step) != ("run" in step), step
        if "run" in step:
            assert step.get("shell") == "bash", step  # a composite action's run step must name its shell
            assert "${{ inputs." not in step["run"]  # inputs reach scripts as variables, never spliced in
    [gate] = [s for s in steps if s.get("id") == "gate"]
    assert gate["run"] == "${{ github.action_path }}/scripts/action.sh" and os.access(SCRIPT, os.X_OK)
    script = SCRIPT.read_text()
    assert all(name in script for name in gate["env"])  # every variable the step passes is read
    written = set(re.findall(r'echo "([a-z-]+)=', script))
    assert set(re.findall(r"steps\.gate\.outputs\.([a-z-]+)", text)) <= written
    uses = [s["uses"] for s in steps if "uses" in s]
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    assert any(u.startswith("actions/github-script@") for u in uses)  # the pull-request comment
    assert steps[-1]["if"] == "inputs.fail-on-gate == 'true' && steps.gate.outputs.passed == 'false'"


def run_action(tmp_path: Path, model_dir: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    outputs, summary = tmp_path / "github_output", tmp_path / "step_summary"
    done = subprocess.run([str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env={
        **os.environ, "FLK_BIN": f"{sys.executable} -m flakecheck", "FLK_MODEL": str(model_dir),
        "FLK_MAX_TOKENS": "8", "GITHUB_OUTPUT": str(outputs), "GITHUB_STEP_SUMMARY": str(summary), **env})
    return done, outputs, summary


def test_the_script_runs_a_promptfoo_config_gates_it_and_writes_the_outputs(tiny_wide_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    (tmp_path / "promptfooconfig.yaml").write_text(CONFIG)
    done, outputs, summary = run_action(tmp_path, tiny_wide_model_dir, FLK_SUITE="promptfooconfig.yaml",
                                        FLK_KERNELS="invariant", FLK_OUT="out")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert values["passed"] == "true" and values["exit-code"] == "0"
    assert (tmp_path / values["report"]).is_file() and (tmp_path / values["junit"]).is_file()
    assert "flakecheck gate ✅ passed" in summary.read_text()
    assert (tmp_path / values["markdown"]).read_text().strip() in summary.read_text()


def test_a_failed_gate_is_an_output_and_bad_input_is_the_exit_code(tiny_wide_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "promptfooconfig.yaml").write_text(CONFIG)
    # the case "never" fails every run: pass^k (a min pass rate of 1) fails the gate, which is an output, not an error
    done, outputs, summary = run_action(tmp_path, tiny_wide_model_dir, FLK_SUITE="promptfooconfig.yaml",
                                        FLK_KERNELS="invariant", FLK_OUT="a", FLK_MIN_PASS_RATE="1")
    assert done.returncode == 0, done.stderr[-2000:]
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert values["passed"] == "false" and values["exit-code"] == "1"
    assert "flakecheck gate ❌ failed" in summary.read_text() and "never" in summary.read_text()
    outputs.unlink()
    done, outputs, _ = run_action(tmp_path, tiny_wide_model_dir, FLK_SUITE="missing.yaml", FLK_OUT="b")
    assert done.returncode == 2 and "missing.yaml" in done.stderr
    assert not outputs.exists()


def test_diff_against_a_run_from_before_fails_on_a_planted_regression(tiny_wide_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    """`diff-against`: the same suite with one assertion made impossible is a regression beyond batch noise."""
    before = CONFIG.replace("{type: icontains, value: e}", "{type: not-contains, value: 'zq9x'}")
    assert before != CONFIG
    (tmp_path / "before.yaml").write_text(before)  # "sea" passes whatever the answer ...
    (tmp_path / "after.yaml").write_text(before.replace("not-contains", "contains"))  # ... and then never
    done, _, _ = run_action(tmp_path, tiny_wide_model_dir, FLK_SUITE="before.yaml", FLK_KERNELS="invariant",
                            FLK_OUT="before")
    assert done.returncode == 0, done.stderr[-2000:]
    done, outputs, summary = run_action(tmp_path, tiny_wide_model_dir, FLK_SUITE="after.yaml",
                                        FLK_KERNELS="invariant", FLK_OUT="after", FLK_DIFF_AGAINST="before/run")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    assert values["passed"] == "false" and values["exit-code"] == "1"
    markdown = (tmp_path / values["markdown"]).read_text()
    assert "regression" in markdown and "sea" in markdown
    assert (tmp_path / "after" / "diff.xml").is_file()
