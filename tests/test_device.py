"""The device as a setting: named once (`auto`, `cpu`, `cuda[:N]`), carried typed to the weights, the KV cache,
the self-check and the record, refused clearly where the machine lacks it, and bounded by the GPU's memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from flakecheck import cli
from flakecheck.engine import loader
from flakecheck.engine.kv_cache import KVCache, KVCacheTooLarge
from flakecheck.engine.settings import EngineSettings
from flakecheck.errors import ModelError, UserError
from flakecheck.kernels.profiles import get_profile
from flakecheck.machine.device import Device, resolve_device
from flakecheck.run.settings import RunConfig

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _exit(argv: list[str], capsys) -> tuple[int, str]:
    old = sys.argv
    sys.argv = ["flakecheck", *argv]
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
            raise SystemExit(0)
    finally:
        sys.argv = old
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out + captured.err


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    path = tmp_path / "two.jsonl"
    path.write_text('{"id": "a", "prompt": "The capital of France is"}\n{"id": "b", "prompt": "def add(a, b):"}\n')
    return path


def test_auto_is_the_cpu_without_a_gpu_and_names_are_canonical() -> None:
    assert resolve_device("auto") == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == "cpu"
    with pytest.raises(UserError, match="--device 'tpu'.*auto \\| cpu \\| cuda \\| cuda:N"):
        resolve_device("tpu")


def test_profile_auto_on_the_cpu_is_the_default_simulated_gpu_and_any_sm_count_is_a_profile() -> None:
    assert EngineSettings.parse(device="cpu", profile="auto").profile == "h100"
    assert EngineSettings.parse(device="cpu", profile="L4").profile == "l4"
    assert get_profile("sm78").sms == 78
    with pytest.raises(UserError, match="--profile"):
        EngineSettings.parse(device="cpu", profile="sm0")


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_gpu_this_machine_lacks_is_refused_in_the_settings(device: str) -> None:
    with pytest.raises(UserError, match=f"--device {device}: no CUDA device is visible here"):
        EngineSettings.parse(device=device)


@NO_CUDA
@pytest.mark.parametrize("command", [
    ["run", "{suite}", "--device", "cuda", "--out", "{out}"],
    ["serve", "--device", "cuda", "--port", "0"],
    ["bench", "engine", "--device", "cuda:0"],
    ["bench", "kernels", "--device", "cuda"],
    ["kernels", "check", "--device", "cuda"],
])
def test_every_entry_point_refuses_cuda_without_one_and_writes_nothing(command: list[str], suite: Path,
                                                                       tmp_path: Path, capsys) -> None:
    out = tmp_path / "never"
    argv = [a.format(suite=suite, out=out) for a in command]
    code, text = _exit(argv, capsys)
    assert code == 2, text
    assert "no CUDA device is visible here" in text and "Traceback" not in text
    assert not out.exists()


def test_an_unknown_device_is_a_usage_error(suite: Path, tmp_path: Path, capsys) -> None:
    code, text = _exit(["run", str(suite), "--device", "gpu0", "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "--device 'gpu0'" in text
    assert not (tmp_path / "r").exists()


def test_the_device_is_recorded_and_named_by_every_report(tiny_model_dir: Path, suite: Path, tmp_path: Path,
                                                           capsys) -> None:
    out = tmp_path / "run"
    code, text = _exit(["run", str(suite), "--model", str(tiny_model_dir), "--device", "cpu", "--max-tokens", "4",
                        "--composition", "name=solo", "--composition", "name=b2,max_batch=2", "--out", str(out),
                        "--no-html", "--quiet"], capsys)
    assert code == 0, text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["config"]["device"] == meta["engine"]["device"] == "cpu"
    assert meta["memory"]["peak_host_bytes"] > 10 * 2**20 and meta["memory"]["peak_device_bytes"] is None
    code, text = _exit(["report", str(out)], capsys)
    assert code == 0 and "torch on cpu" in text
    code, text = _exit(["report", str(out), "--format", "markdown"], capsys)
    assert "torch on cpu" in text
    code, text = _exit(["report", str(out), "--format", "json"], capsys)
    assert json.loads(text)["device"] == "cpu"


def test_a_recorded_device_can_be_replaced_when_the_run_is_read_back(tmp_path: Path) -> None:
    config = RunConfig.parse(tmp_path / "s.jsonl", device="cpu")
    recorded = {**config.to_dict(), "device": "cuda:3"}  # as a GPU machine would have written it
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="--device cuda:3"):
            RunConfig.from_dict(recorded)
    assert RunConfig.from_dict(recorded, device="cpu").engine.device == "cpu"


def test_weight_bytes_are_the_checkpoint_in_the_dtype(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    unique = {t.data_ptr(): t for t in model.state_dict().values()}  # a tied head shares the embedding's storage
    parameters = sum(t.numel() for t in unique.values())
    assert loader.weight_bytes(tiny_model_dir, torch.bfloat16) == 2 * parameters
    assert loader.weight_bytes(tiny_model_dir, torch.float32) == 4 * parameters


def test_a_model_too_large_for_the_gpu_is_refused_with_what_it_needs(monkeypatch) -> None:
    gib = 1 << 30
    monkeypatch.setattr(loader, "memory_info", lambda device: (60 * gib, 80 * gib))  # 20 GiB in use elsewhere
    monkeypatch.setattr(loader, "device_name", lambda device: "a GPU")
    loader.check_fits("big", 16 * gib, Device("cuda:0"), 0.9)  # 16 GiB: 52 GiB allowed (72 - 20)
    with pytest.raises(ModelError, match=r"need 60\.0 GiB on cuda:0 \(a GPU\), but 52\.0 GiB of its 80\.0 GiB"):
        loader.check_fits("big", 60 * gib, Device("cuda:0"), 0.9)
    assert loader.kv_budget("big", Device("cuda:0"), 0.9) == 52 * gib


def test_the_kv_cache_stays_within_its_budget() -> None:
    per_position = 2 * 2 * 4 * 2 * 8 * 4  # k and v, 2 layers, 4 slots, 2 heads, dim 8, fp32
    cache = KVCache(2, 4, 2, 8, torch.float32, length=16, budget_bytes=per_position * 40)
    cache.ensure_length(30)  # doubling would ask for 32 positions: within 40
    assert cache.length == 32
    cache.ensure_length(35)  # doubling would ask for 64: the cache grows to what the budget holds
    assert cache.length == 40
    with pytest.raises(KVCacheTooLarge, match="needs .* GiB, but .* GiB of the GPU are left"):
        cache.ensure_length(41)
    with pytest.raises(KVCacheTooLarge):
        KVCache(2, 4, 2, 8, torch.float32, length=41, budget_bytes=per_position * 40)
