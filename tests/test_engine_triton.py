"""The whole engine on the Triton kernels: a run with `backend="triton"` under fixed-order kernels gives the same
bits under every batch composition, and the Triton kernels follow the torch twins' plans.

Runs natively on CUDA; on CPU only under TRITON_INTERPRET=1 (set before the kernels are decorated), so
tests/test_kernels_triton_interpreted.py runs this file in a subprocess on a tiny model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from flakecheck.machine.device import Device

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not (INTERPRETED or torch.cuda.is_available()),
                                reason="needs CUDA or TRITON_INTERPRET=1 (see test_kernels_triton_interpreted.py)")
DEVICE = Device("cuda:0" if torch.cuda.is_available() and not INTERPRETED else "cpu")
PROMPTS = ["The capital of France is", "What is 7 * 6? It is", "def add(a, b):"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "three.jsonl"
    path.write_text("".join(json.dumps({"id": f"c{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def _compositions():
    from flakecheck.data.compositions import Composition

    # serial; three sequences a step with prompts cut into 5-token chunks; a warm prefix cache
    return [Composition("solo"), Composition("batch3", max_batch=3, chunk=5),
            Composition("prefix", max_batch=2, prefix_cache=True)]


def test_fixed_order_triton_run_is_bitwise_across_compositions(tiny_wide_model_dir: Path, suite: Path,
                                                               tmp_path: Path) -> None:
    import flakecheck

    run = flakecheck.run_suite(suite, model=str(tiny_wide_model_dir), dtype="bfloat16", kernels="invariant",
                               backend="triton", device=DEVICE, compositions=_compositions(), max_tokens=6,
                               out=tmp_path / "run", html=False)
    meta = json.loads((run.path / "meta.json").read_text())
    assert (meta["engine"]["backend"], meta["engine"]["device"], meta["config"]["device"]) == ("triton", DEVICE,
                                                                                              DEVICE)
    tokens = pq.read_table(run.path / "tokens.parquet").to_pandas()
    columns = ["token_id", "top1_id", "top1_logprob", "top2_id", "top2_logprob"]
    reference = tokens[tokens.composition == "solo"].sort_values(["case_id", "step"])[columns].reset_index(drop=True)
    assert len(reference) == len(PROMPTS) * 6
    for name in ("batch3", "prefix"):
        other = tokens[tokens.composition == name].sort_values(["case_id", "step"])[columns].reset_index(drop=True)
        assert other.equals(reference), f"{name}: the Triton fixed-order run differs from solo"
    assert set(run.cases.status) <= {"stable", "fragile"}


@pytest.mark.parametrize("policy", ["invariant", "splitk"])
def test_triton_follows_the_torch_twins_plans(tiny_wide_model_dir: Path, policy: str) -> None:
    """Both backends execute one StepPlan (the same split counts and split sizes); inside a split each
    accumulates in its own order (a Triton tile's dot vs an MKL GEMM), so the bits may differ but the tokens
    and, to fp32 rounding, the log-probabilities agree."""
    from flakecheck.engine import LLMEngine, Request, SamplingParams, load_model
    from flakecheck.kernels.policy import parse_policy
    from flakecheck.kernels.registry import get_ops

    model = load_model(str(tiny_wide_model_dir), "float32", DEVICE)
    prompts = [model.tokenizer(p)["input_ids"] for p in PROMPTS]
    got = {}
    for backend in ("torch", "triton"):
        if backend == "torch" and DEVICE != "cpu":
            continue  # the twins are CPU kernels
        engine = LLMEngine(model, get_ops(parse_policy(policy), backend, "h100"), max_num_seqs=3)
        requests = [Request(i, ids, SamplingParams(max_tokens=5, ignore_eos=True)) for i, ids in enumerate(prompts)]
        got[backend] = engine.generate(requests)
    if "torch" not in got:
        pytest.skip("on CUDA the twins do not run; the run test above covers the Triton side")
    for twin, tri in zip(got["torch"], got["triton"]):
        assert twin.token_ids == tri.token_ids
        assert twin.top1_ids == tri.top1_ids
        assert max(abs(a - b) for a, b in zip(twin.top1_logprobs, tri.top1_logprobs)) < 1e-4
