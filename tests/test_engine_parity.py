"""Parity with transformers' own forward pass on tiny random Llama-family models, in fp32.

What is compared: full fp32 log-softmax vectors over the vocabulary (the engine's output; a
log-softmax is the logits less one constant per row, so this bounds the logit differences up to
that shift), at every prompt position of a prefill and at each of 32 decode steps, plus the greedy
tokens against transformers' own `generate`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt, load_model
from flakecheck.kernels.policy import parse_policy

TOLERANCE = 1e-4
DECODE_STEPS = 32
# every family, and the windowed variants with prompts longer than their window (tests/tiny_models.py)
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "mistral-window", "qwen2-window", "gemma2", "gemma3", "phi3",
                 "olmo2", "granite", "mixtral", "qwen2-moe", "qwen3-moe", "olmoe")


def _hf_logprobs(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = hf(torch.tensor([token_ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _hf_greedy(model_dir: Path, prompt: list[int], steps: int) -> list[int]:
    from transformers import AutoModelForCausalLM, GenerationConfig

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # no end-of-sequence token at all, as the engine's ignore_eos: min_new_tokens would instead forbid picking it
    hf.generation_config.eos_token_id = hf.config.eos_token_id = None
    config = GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          generation_config=config)
    return out[0, len(prompt):].tolist()


def _engine_step_logprobs(engine: LLMEngine, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """The engine's generated tokens, and the full log-softmax it sampled each of them from."""
    captured: list[torch.Tensor] = []
    forward = engine.runner.forward_batch  # every step's forward pass goes through it

    def recording_forward(batch):  # type: ignore[no-untyped-def]
        logits, logprobs = forward(batch)
        captured.append(logprobs.clone())
        return logits, logprobs

    engine.runner.forward_batch = recording_forward  # type: ignore[method-assign]
    completion = engine.generate([Request(0, prompt, SamplingParams(max_tokens=steps, ignore_eos=True))])[0]
    return completion.token_ids, torch.cat(captured)


def _prompt(model) -> list[int]:  # type: ignore[no-untyped-def]
    return encode_prompt(model, [{"role": "user", "content": "What is the capital of France? Answer briefly."}])


def _llama3_rope_dir(src: Path, dst: Path) -> Path:
    """The tiny Llama with Llama-3 RoPE scaling, so the parity test covers a scaled rope type."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["rope_parameters"] = {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(params=[*ARCHITECTURES, "llama3-rope"])
def model_dir(request: pytest.FixtureRequest, tiny_model_factory, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    if request.param == "llama3-rope":
        return _llama3_rope_dir(tiny_model_factory("llama"), tmp_path_factory.mktemp("llama3") / "model")
    return tiny_model_factory(request.param)


def test_prefill_matches_transformers_at_every_prompt_position(model_dir: Path) -> None:
    model = load_model(str(model_dir), "float32")
    prompt = _prompt(model)
    engine = LLMEngine(model)
    ours = engine.runner.prompt_logprobs(prompt)
    reference = _hf_logprobs(model_dir, prompt)
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() <= TOLERANCE


def test_decode_steps_match_transformers(model_dir: Path) -> None:
    model = load_model(str(model_dir), "float32")
    prompt = _prompt(model)
    tokens, ours = _engine_step_logprobs(LLMEngine(model), prompt, DECODE_STEPS)
    # transformers' forward over prompt + generated tokens gives the distribution of every step at once
    reference = _hf_logprobs(model_dir, prompt + tokens[:-1])[len(prompt) - 1 :]
    assert ours.shape == reference.shape == (DECODE_STEPS, model.config.vocab_size)
    assert (ours - reference).abs().max().item() <= TOLERANCE
    assert tokens == reference.argmax(dim=-1).tolist()


def test_greedy_tokens_match_transformers_generate(model_dir: Path) -> None:
    model = load_model(str(model_dir), "float32")
    prompt = _prompt(model)
    completion = LLMEngine(model).generate(
        [Request(0, prompt, SamplingParams(max_tokens=DECODE_STEPS, ignore_eos=True))]
    )[0]
    assert completion.token_ids == _hf_greedy(model_dir, prompt, DECODE_STEPS)


def test_top2_is_the_two_best_of_the_distribution(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir), "float32")
    prompt = _prompt(model)
    engine = LLMEngine(model)
    tokens, logprobs = _engine_step_logprobs(engine, prompt, 8)
    completion = LLMEngine(model).generate([Request(0, prompt, SamplingParams(max_tokens=8, ignore_eos=True))])[0]
    best = logprobs.topk(2, dim=-1)
    assert completion.top1_ids == completion.token_ids == best.indices[:, 0].tolist()
    assert completion.top2_ids == best.indices[:, 1].tolist()
    assert completion.top1_logprobs == pytest.approx(best.values[:, 0].tolist(), abs=1e-6)
    assert completion.top2_logprobs == pytest.approx(best.values[:, 1].tolist(), abs=1e-6)
    assert all(a >= b for a, b in zip(completion.top1_logprobs, completion.top2_logprobs))


@pytest.mark.parametrize("rows", [1, 2, 7, 33])
@pytest.mark.parametrize("weight_scale", [1.0, 1e-4, 1e4])
def test_native_bf16_linear_is_a_bf16_gemm_with_fp32_accumulation(rows: int, weight_scale: float) -> None:
    """Whatever CPU kernel native picks for bf16 (FBGEMM fp16 on scaled copies, fp32 MKL, ATen's
    bf16), the result is the exact product sum rounded once to bf16, give or take fp32 summation
    order: at most one bf16 ulp from the correctly rounded value, and nearly always equal to it."""
    from flakecheck.kernels import get_ops

    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(96, 80, generator=gen) * weight_scale).to(torch.bfloat16)
    weight[0, 0] = weight_scale * 3e-6  # widen the range the fp16 packing has to cover
    bias = torch.randn(96, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, 80, generator=gen).to(torch.bfloat16)
    exact = x.double() @ weight.double().T + bias.double()
    rounded = exact.float().to(torch.bfloat16)
    for fast in (True, False):
        out = get_ops(parse_policy("native"), fast_cpu_matmuls=fast).linear(x, weight, bias)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, 96)
        ulp = (rounded.double().abs() * 2.0**-7).clamp(min=1e-30)
        assert ((out.double() - rounded.double()).abs() <= ulp).all()
        assert (out == rounded).float().mean().item() > 0.95
