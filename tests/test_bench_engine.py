"""The engine benchmark itself (a smoke test: no timing is asserted, only that the work is equal
and the figures are consistent)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flakecheck.bench import engine as bench

KEYS = ("engine_tps_bs1", "hf_tps_bs1", "engine_tps_bs16", "hf_tps_bs16", "speedup_bs1", "speedup_bs16")


def _check(result: dict, workload: bench.Workload) -> None:
    for key in KEYS:
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] > 0, key
    for batch in workload.batch_sizes:
        assert result[f"generated_tokens_bs{batch}"] == workload.num_prompts * workload.max_tokens
        ratio = result[f"engine_tps_bs{batch}"] / result[f"hf_tps_bs{batch}"]
        assert result[f"speedup_bs{batch}"] == pytest.approx(ratio, rel=0.01)
    # the floor: a positive time, and the per-token figures are the throughputs' inverses
    assert result["weights_pass_ms"] > 0
    assert result["hf_ms_per_token_bs1"] == pytest.approx(1000 / result["hf_tps_bs1"], rel=0.01)
    assert result["hf_over_floor_bs1"] == pytest.approx(
        result["hf_ms_per_token_bs1"] / result["weights_pass_ms"], rel=0.02)


def test_benchmark_runs_equal_work_on_a_tiny_model(tiny_model_dir: Path) -> None:
    workload = bench.Workload(num_prompts=3, max_tokens=4)
    _check(bench.run_benchmark(str(tiny_model_dir), workload), workload)


def test_prompts_are_chat_prompts_of_the_model(tiny_model_dir: Path) -> None:
    from flakecheck.engine import load_model

    model = load_model(str(tiny_model_dir), "float32")
    prompts = bench.chat_prompts(model, 40)
    assert len(prompts) == 40 and len({tuple(p) for p in prompts}) >= 32
    start = model.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert all(p[0] == start for p in prompts)


@pytest.mark.slow
def test_quick_benchmark_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(json_out=True, quick=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1
    _check(json.loads(lines[0]), bench.QUICK)
