"""Every model family on a tiny random model from transformers' own config class (tests/tiny_models.py; parity
with transformers is tests/test_engine_parity.py): under `invariant` a request's tokens and logprobs are bitwise
the same solo, batched, in chunked prefill and behind a prefix-cache hit — with prompts longer than the family's
sliding window where it has one; under `splitk` the batch moves them; the machine's self-check passes for the
family's shapes; simulated replay gives bitwise the traces of replaying each composition alone."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt, load_model
from flakecheck.engine.models import probe_dims, read_config
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.errors import ModelError
from flakecheck.kernels.policy import parse_policy
from tests.machine_paths import engine_ops
from tests.tiny_models import WINDOW

FAMILIES = ("mistral-window", "qwen2-window", "gemma2", "gemma3", "phi3", "olmo2", "granite")  # MoE: tests/test_moe.py
QUESTIONS = [
    "What is the capital of France? Answer in one word, then explain why in a sentence or two.",
    "2 + 2?",
    "Write a haiku about the sea, the wind and the morning light over the water.",
    "def add(a, b):",
    "Answer with a single letter: A, B, C or D. Which one is the second letter of the alphabet?",
]
TOKENS = 10


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tiny_model_factory):  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_factory(request.param)), "bfloat16")


def _requests(model, questions: list[str] = QUESTIONS, tokens: int = TOKENS) -> list[Request]:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return [Request(i, encode_prompt(model, [{"role": "user", "content": q}]), params)
            for i, q in enumerate(questions)]


def _fingerprints(model, ops, requests, **engine_args) -> dict:  # type: ignore[no-untyped-def]
    engine = LLMEngine(model, ops, **{"max_num_seqs": len(requests), **engine_args})
    return {c.request_id: (c.token_ids, c.top1_logprobs, c.top2_ids, c.top2_logprobs)
            for c in engine.generate(requests)}


def _solo(model, ops, requests) -> dict:  # type: ignore[no-untyped-def]
    """Each request's fingerprint served alone."""
    solo: dict = {}
    for r in requests:
        solo.update(_fingerprints(model, ops, [r]))
    return solo


def test_prompts_outrun_the_sliding_window(family) -> None:
    windows = family.config.traits.windows
    if not windows:
        pytest.skip("this family attends to every key: no window to outrun")
    assert windows == (WINDOW,) or windows == (WINDOW + 4,)
    assert min(len(r.prompt_ids) for r in _requests(family)) > max(windows)


def test_invariant_is_bitwise_in_every_composition(family) -> None:
    assert_invariant_in_every_composition(family, _requests(family))


def assert_invariant_in_every_composition(family, requests: list[Request]) -> None:  # type: ignore[no-untyped-def]
    """`invariant`: each request's bits solo = batched (two orders) = chunked = behind a prefix-cache hit."""
    ops = engine_ops("invariant", family.config)
    solo = _solo(family, ops, requests)
    compositions = {
        "batched": (requests, {}),
        "batched, reversed": (requests[::-1], {}),
        "chunked prefill (7 tokens a step)": (requests, {"max_num_batched_tokens": 7}),
    }
    for name, (batch, args) in compositions.items():
        assert _fingerprints(family, ops, batch, **args) == solo, f"invariant: changed under {name}"
    engine = LLMEngine(family, ops, max_num_seqs=2, enable_prefix_caching=True)
    target = requests[0]
    engine.generate([Request("warm", target.prompt_ids[:-2] + [target.prompt_ids[-1]], target.params)])
    hit = engine.generate([target])[0]
    assert hit.cached_prompt_tokens > 0
    assert (hit.token_ids, hit.top1_logprobs, hit.top2_ids, hit.top2_logprobs) == solo[target.request_id]


@pytest.mark.parametrize("architecture", FAMILIES)
def test_splitk_moves_the_numbers_with_the_batch(architecture: str, tiny_wide_factory) -> None:
    family = load_model(str(tiny_wide_factory(architecture)), "bfloat16")
    assert_splitk_moves(family, _requests(family))


def assert_splitk_moves(family, requests: list[Request]) -> None:  # type: ignore[no-untyped-def]
    """`splitk`: the same composition twice gives the same bits, solo and a chunked batch do not."""
    ops = engine_ops("splitk", family.config)
    solo = _solo(family, ops, requests)
    batched = _fingerprints(family, ops, requests, max_num_batched_tokens=7)
    assert _fingerprints(family, ops, requests, max_num_batched_tokens=7) == batched, "same composition, same bits"
    assert batched != solo, "split-K kernels should change some logprob with the batch"


def test_self_check_passes_for_the_family_shapes(family) -> None:
    for policy in ("invariant", "splitk"):
        spec = resolve_engine(EngineSettings(dtype="bfloat16", policy=parse_policy(policy)),
                              probe_dims(family.config))
        assert not spec.verification.refused
        assert spec.simulated


def test_simulated_replay_is_physical_replay(tiny_model_factory, tmp_path: Path) -> None:
    """Gemma 3: local layers with a window shorter than the prompts, global layers with their own RoPE."""
    assert_simulated_is_physical(load_model(str(tiny_model_factory("gemma3")), "bfloat16"), QUESTIONS, 6, tmp_path)


def assert_simulated_is_physical(model, questions: list[str], max_tokens: int,  # type: ignore[no-untyped-def]
                                 tmp_path: Path) -> None:
    """Under `splitk`, simulated replay's runs, tokens and cases tables equal physical replay's, bit for bit."""
    suite = tmp_path / "s.jsonl"
    suite.write_text("".join(json.dumps({"id": f"q{i}", "input": q, "max_tokens": max_tokens}) + "\n"
                             for i, q in enumerate(questions)))
    compositions = [Composition("solo"), Composition("batch4", max_batch=4),
                    Composition("chunked", max_batch=4, chunk=7), Composition("prefix", prefix_cache=True)]
    runs = {mode: flakecheck.run_suite(suite, model=model, out=tmp_path / mode, html=False, replay=mode,
                                       kernels="splitk", compositions=compositions)
            for mode in ("physical", "simulated")}
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(runs["physical"], table), getattr(runs["simulated"], table),
                                      check_exact=True)


@pytest.mark.parametrize(("architecture", "missing"), [("PhimoeForCausalLM", "mixture-of-experts"),
                                                       ("GptOssForCausalLM", "attention sinks"),
                                                       ("DeepseekV3ForCausalLM", "latent attention"),
                                                       ("Gemma3ForConditionalGeneration", "vision"),
                                                       ("GPT2LMHeadModel", "no implementation")])
def test_unsupported_architectures_say_what_is_missing(architecture: str, missing: str) -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, architectures=[architecture])
    with pytest.raises(ModelError, match=missing) as info:
        read_config(config, "m")
    assert architecture in str(info.value) and "Gemma3ForCausalLM" in str(info.value)


def test_no_module_outside_engine_models_names_a_model_class() -> None:
    """The rest of the package reads models through the CausalLM interface and the registry only."""
    package = Path(flakecheck.__file__).parent
    classes = ("DecoderLM", "DecoderLayer", "LlamaForCausalLM")
    offenders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if "engine/models" not in path.as_posix() and any(c in path.read_text() for c in classes)]
    assert offenders == []
