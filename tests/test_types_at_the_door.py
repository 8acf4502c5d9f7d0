"""A device and a kernel policy are values made once where text enters (the CLI, the Python API, meta.json) and
carried typed below: no code under the door reads a device's name again or parses a policy a second time,
bench and `kernels check` take every policy a run takes, and run directories written before still read."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from flakecheck.data.record import RunRecord
from flakecheck.engine.settings import EngineSettings, parse_kernels
from flakecheck.engine.spec import EngineSpec
from flakecheck.errors import UserError
from flakecheck.kernels.policy import ORDERS, parse_policy
from flakecheck.machine.device import CPU, Device, DeviceError, resolve_device
from flakecheck.run.settings import RunConfig
from tests.test_run import cli_run

PACKAGE = Path(__file__).resolve().parents[1] / "flakecheck"
DEVICE_MODULE = PACKAGE / "machine" / "device.py"
PER_CLASS = "matmul=splitk,attention=invariant,norm=invariant"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE.parent)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


# ------------------------------------------------------------------------------------------ what the code says

def test_no_device_name_is_read_again_below_the_door() -> None:
    found = [f"{name}:{i}: {line.strip()}" for name, text in _sources().items()
             if name != str(DEVICE_MODULE.relative_to(PACKAGE.parent))
             for i, line in enumerate(text.splitlines(), 1)
             if re.search(r'startswith\("cuda|torch\.device\(|startswith\("--device', line)]
    assert found == []


def test_a_kernel_policy_is_parsed_in_one_place() -> None:
    """Text becomes a KernelPolicy in kernels/policy.py, called through engine/settings.py's parse_kernels (the
    door's UserError); whole-model policies are its constants; no module keeps its own list of the orders."""
    parsers, whole, by_name, order_lists = [], [], [], []
    for name, text in _sources().items():
        if name != "flakecheck/kernels/policy.py":
            whole += [name] * text.count("KernelPolicy.of(")
            if name != "flakecheck/engine/settings.py":
                parsers += [name] * text.count("parse_policy(")
        by_name += [name] * len(re.findall(r'\.name\s*[!=]=\s*"native"', text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                if set(ORDERS) <= {e.value for e in node.elts} and name != "flakecheck/kernels/policy.py":
                    order_lists.append(name)
    assert (parsers, whole, by_name, order_lists) == ([], [], [], [])


def test_the_backend_is_resolved_once_per_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from flakecheck.kernels import registry

    calls = []
    real = registry.resolve_backend
    monkeypatch.setattr(registry, "resolve_backend", lambda *a: calls.append(a) or real(*a))
    settings = EngineSettings.parse(kernels="invariant", device="cpu")
    assert settings.kernels_backend == "torch" and len(calls) == 1
    assert EngineSettings.parse(kernels="native", device="cpu").kernels_backend == "torch" and len(calls) == 1


# --------------------------------------------------------------------------------------------- the values

def test_a_device_is_a_value_that_answers_what_the_code_asks() -> None:
    gpu = Device("cuda:2")
    assert (gpu.is_cuda, gpu.index, gpu.type, gpu == "cuda:2") == (True, 2, "cuda", True)
    assert (CPU.is_cuda, CPU.index, CPU.type, CPU.torch()) == (False, None, "cpu", torch.device("cpu"))
    assert json.loads(json.dumps({"device": gpu})) == {"device": "cuda:2"}  # meta.json writes its name
    for unresolved in ("auto", "cuda", "CPU", "gpu", "cuda:x"):
        with pytest.raises(ValueError, match="Device.parse"):
            Device(unresolved)
    assert isinstance(resolve_device(" CPU "), Device) and Device.parse("cpu") is CPU


def test_below_the_door_a_device_must_be_typed() -> None:
    with pytest.raises(TypeError, match="Device"):
        EngineSettings(device="cpu")  # type: ignore[arg-type]
    assert EngineSettings.parse(device="cpu").device is CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a visible GPU")
def test_a_missing_gpu_is_a_typed_error() -> None:
    with pytest.raises(DeviceError, match="--device cuda:1: no CUDA device"):
        Device.parse("cuda:1")
    with pytest.raises(DeviceError, match="choose auto"):
        Device.parse("tpu")


def test_the_python_api_may_pass_a_parsed_policy_and_device() -> None:
    policy = parse_policy(PER_CLASS)
    settings = EngineSettings.parse(kernels=policy, device=CPU)
    assert settings.policy is policy and settings.device is CPU
    assert parse_policy("native").all_native and not parse_policy("matmul=native").all_native
    assert parse_policy("matmul=native").physical


# ------------------------------------------------------------------------------ bench and kernels check

def test_bench_engine_refuses_a_bad_policy_naming_the_option(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli_run(monkeypatch, capsys, "bench", "engine", "--kernels", "matmul=fast", "--quick")
    assert code == 2 and "--kernels" in err and "fast" in err


def test_bench_engine_takes_a_per_class_policy(tiny_model_dir: Path) -> None:
    from flakecheck.bench import engine as bench

    workload = bench.Workload(num_prompts=2, max_tokens=3)
    result = bench.run_benchmark(str(tiny_model_dir), workload, "float32", CPU, parse_kernels(PER_CLASS))
    assert result["kernels"] == PER_CLASS and result["generated_tokens_bs1"] > 0


def test_bench_engine_runs_the_tp_invariant_order(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  tiny_model_dir: Path) -> None:
    code, out, err = cli_run(monkeypatch, capsys, "bench", "engine", "--kernels", "tp-invariant", "--quick", "--json",
                             "--device", "cpu", "--model", str(tiny_model_dir))
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["kernels"] == "tp-invariant" and result["generated_tokens_bs1"] > 0


def test_kernels_check_measures_a_per_class_policy(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from flakecheck.machine.invariance_probes import ProbeDims

    small = ProbeDims(projections=((192, 64), (64, 128)), lm_head=(512, 64), heads=2, kv_heads=1, head_dim=32,
                      norm_widths=(64,))
    monkeypatch.setattr("flakecheck.machine.kernels_check.SMOLLM2", small)
    code, out, err = cli_run(monkeypatch, capsys, "kernels", "check", "--json", "--device", "cpu", "--kernels",
                             PER_CLASS)
    report = json.loads(out)
    assert code == 0, err
    measured = {r["policy"] for r in report["results"]}
    assert {PER_CLASS, "tp-invariant", "invariant", "splitk", "native"} <= measured
    assert set(report["selfcheck"]) == {"invariant", "splitk", PER_CLASS}
    # attention and norm are fixed-order under the per-class policy: their probes hold bitwise
    assert all(r["invariant"] for r in report["results"] if r["policy"] == PER_CLASS and r["op"] != "matmul")


# ------------------------------------------------------------------------------ run directories from before

# meta.json's `config` and `engine` blocks as the version of 2026-12-03 (b9eba8b) wrote them: no
# gpu_memory_utilization, no sample_tp, no triton block
OLD_CONFIG = {
    "suite": "suites/demo.jsonl", "model": "smollm2", "dtype": "bfloat16", "kernels": PER_CLASS, "backend": "auto",
    "profile": "h100", "device": "cpu", "compositions": [], "max_tokens": 16, "gap_threshold": 0.05,
    "gap_window": 50, "repeat": 1, "limit": 3, "ids": [], "replay": "auto", "out": None, "html": True,
    "input_format": "auto", "grader": [], "grader_timeout": 60.0, "ray": None, "workers": 2, "cpus_per_worker": None,
    "allow_mixed_devices": False, "sample": 0, "load": "poisson:16", "load_model": None, "sample_seed": 0,
}


def _old_engine(verification: dict) -> dict:
    return {"policy": PER_CLASS, "op_classes": {"matmul": "splitk", "attention": "invariant", "norm": "invariant"},
            "backend": "torch", "device": "cpu", "profile": "h100", "dtype": "bfloat16", "machine": {},
            "machine_summary": "a CPU", "verification": verification, "verification_summary": "ok",
            "simulated": True}


def test_a_config_written_before_reads_back_typed() -> None:
    config = RunConfig.from_dict(OLD_CONFIG)
    assert config.policy == parse_policy(PER_CLASS) and config.engine.device is CPU
    assert config.engine.kernels_backend == "torch"
    assert RunConfig.from_dict(config.to_dict()) == config


def test_an_engine_block_written_before_reads_back_typed() -> None:
    from flakecheck.kernels.paths import FAST
    from flakecheck.machine.fingerprint import current
    from flakecheck.machine.selfcheck import Verification

    verification = Verification(current(), PER_CLASS, FAST, (), (), (), (), 0.0)
    spec = EngineSpec.from_dict(_old_engine(verification.to_dict()))
    assert spec.policy == parse_policy(PER_CLASS) and isinstance(spec.device, Device) and not spec.device.is_cuda
    record = RunRecord.of({"source": "engine", "model": "smollm2", "engine": _old_engine({})})
    assert record.computer.op_orders == ("splitk", "invariant", "invariant") and record.computer.varies


def test_an_engine_block_with_an_unknown_order_is_refused() -> None:
    block = {**_old_engine({}), "op_classes": {"matmul": "fast", "attention": "invariant", "norm": "invariant"}}
    with pytest.raises(UserError, match="engine.op_classes.*fast"):
        EngineSpec.from_dict(block)


@pytest.mark.parametrize(("policy", "orders"), [
    ("invariant", ("invariant",) * 3), ("splitk", ("splitk",) * 3), ("tp-invariant", ("tp-invariant",) * 3),
    (PER_CLASS, ()),
])
def test_flat_fields_of_older_engine_runs_still_read(policy: str, orders: tuple[str, ...]) -> None:
    record = RunRecord.of({"source": "engine", "model": "m", "policy": policy, "backend": "torch",
                           "profile": "h100"})
    assert record.computer.policy == policy and record.computer.op_orders == orders


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a visible GPU")
def test_explain_tells_a_run_made_on_a_gpu_by_the_error_type_not_its_text(tmp_path: Path) -> None:
    from flakecheck.explain.source import open_run
    from tests.run_builder import CaseSpec, RunSpec, write_run

    config = {**OLD_CONFIG, "kernels": "splitk", "device": "cuda:3", "suite": str(tmp_path / "built.jsonl")}
    run = write_run(tmp_path / "run", RunSpec(["a", "b"], [CaseSpec("c1", None, [[1, 2], [1, 2]], [0.5, 0.5])],
                                              meta_extra={"config": config}))
    with pytest.raises(UserError, match=r"the run's device: --device cuda:3: no CUDA.*--device cpu explains it"):
        open_run(run.path)
    with pytest.raises(UserError, match="field 'config' does not describe a run: --device 'tpu'"):
        open_run(run.path, device="tpu")


def test_run_config_takes_the_values_the_api_may_pass(tmp_path: Path) -> None:
    policy = parse_policy(PER_CLASS)
    config = RunConfig.parse(tmp_path / "s.jsonl", kernels=policy, device=CPU)
    assert config.policy is policy and config.engine.device is CPU
    assert RunConfig.from_dict(config.to_dict()).policy == policy  # recorded as text, read by the same parser
