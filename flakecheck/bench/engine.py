"""`flakecheck bench engine`: the engine against transformers' `generate` on the same work.

Both sides get the same chat prompts, the same bf16 weights, greedy decoding and exactly the
same number of new tokens per prompt (the engine ignores EOS, `generate` gets min_new_tokens),
so tokens per second compare equal work. The work is split into rounds and the two sides
alternate round by round, so that load from other processes on a shared machine falls on both.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt
from flakecheck.engine.loader import LoadedModel
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy
from flakecheck.machine.device import CPU, Device

QUESTIONS = [
    "What is the capital of France?", "Name three primary colours.", "How many legs does a spider have?",
    "What is 12 times 7?", "Write a haiku about the sea.", "Explain what a prime number is.",
    "Who wrote Romeo and Juliet?", "What is the boiling point of water in Celsius?",
    "Give me a synonym for happy.", "What is photosynthesis?", "Translate 'good morning' into French.",
    "What is the largest planet in the solar system?", "List the days of the week.",
    "Why is the sky blue?", "What does a CPU do?", "Suggest a name for a pet cat.",
    "How do you make a cup of tea?", "What is the square root of 81?", "Describe a rainbow.",
    "What is the opposite of cold?", "Name a famous painting.", "What language is spoken in Brazil?",
    "How many continents are there?", "What is gravity?", "Write one sentence about autumn.",
    "What is the chemical symbol for gold?", "Who was Ada Lovelace?", "What is a noun?",
    "How many minutes are in an hour?", "Recommend a book for a child.", "What do bees make?",
    "What is the speed of light?", "Tell me a fun fact about octopuses.", "What is an adjective?",
    "Name a fruit that is yellow.", "What is the freezing point of water in Fahrenheit?",
]

NATIVE = UNIFORM_POLICIES["native"]  # what `generate` runs: the framework's own kernels


@dataclass(frozen=True)
class Workload:
    num_prompts: int
    max_tokens: int
    batch_sizes: tuple[int, ...] = (1, 16)


FULL = Workload(num_prompts=32, max_tokens=64)
QUICK = Workload(num_prompts=4, max_tokens=8)


def chat_prompts(model: LoadedModel, n: int) -> list[list[int]]:
    return [encode_prompt(model, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]) for i in range(n)]


def time_engine(engine: LLMEngine, prompts: list[list[int]], batch: int, max_tokens: int) -> tuple[float, int]:
    """Seconds and generated tokens for the engine to finish `prompts` at max batch `batch`."""
    engine.reconfigure(max_num_seqs=batch)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    requests = [Request(i, ids, params) for i, ids in enumerate(prompts)]
    start = time.perf_counter()
    completions = engine.generate(requests)
    seconds = time.perf_counter() - start
    return seconds, sum(len(c.token_ids) for c in completions)


def time_hf(hf_model: Any, pad_id: int, prompts: list[list[int]], batch: int, max_tokens: int) -> tuple[float, int]:
    """Seconds and generated tokens for `generate` over `prompts` in left-padded batches of `batch`."""
    seconds, generated = 0.0, 0
    device = hf_model.device
    for lo in range(0, len(prompts), batch):
        group = prompts[lo : lo + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, pad_token_id=pad_id,
            )
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the engine's side waits for its tokens too (it reads them back)
        seconds += time.perf_counter() - start
        generated += (out.shape[1] - width) * len(group)
    return seconds, generated


def weights_pass_ms(hf_model: Any, repeats: int = 7) -> float:
    """Median milliseconds of one batch-1 pass over every linear weight (the LM head included) with the
    framework's own matmul: the time to stream the weights once, a floor under any batch-1 decode step."""
    device = hf_model.device
    linears = [m for m in hf_model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m: torch.zeros(1, m.in_features, dtype=m.weight.dtype, device=device) for m in linears}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass warms caches and allocations, and is dropped
            start = time.perf_counter()
            for m in linears:
                torch.nn.functional.linear(inputs[m], m.weight)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[1:])


def run_benchmark(spec: str, workload: Workload, dtype: str = "bfloat16", device: Device = CPU,
                  kernels_policy: KernelPolicy = NATIVE) -> dict[str, Any]:
    """Tokens per second of both sides at every batch size; the two sides alternate round by round. `device`
    (resolved: cpu or cuda:N) holds both; the engine runs `kernels_policy` (native: the framework's own)."""
    threads = os.environ.get("FLAKECHECK_BENCH_THREADS")
    if threads:  # both sides share the process, hence the thread count
        torch.set_num_threads(int(threads))
    settings = EngineSettings(spec, dtype, kernels_policy, device=device)
    model = settings.load()
    prompts = chat_prompts(model, workload.num_prompts)
    start = time.perf_counter()
    # the kernels on the paths chosen for this machine (its CPU's bf16 instructions, if any; a GPU's own)
    kernels = resolve_engine(settings, probe_dims(model.config))
    engine = LLMEngine(model, kernels.ops())
    engine_setup_s = time.perf_counter() - start
    start = time.perf_counter()
    placed = {"device_map": str(device)} if device.is_cuda else {}
    hf_model = AutoModelForCausalLM.from_pretrained(model.path, dtype=model.dtype, use_safetensors=True,
                                                    **placed).eval()
    hf_setup_s = time.perf_counter() - start
    pad_id = model.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else min(model.eos_token_ids)
    # warm both sides up (first-call allocations, lazy imports) outside the timed rounds
    time_engine(engine, prompts[:2], 2, 2)
    time_hf(hf_model, pad_id, prompts[:2], 2, 2)
    result: dict[str, Any] = {"model": spec, "dtype": dtype, "device": device, "kernels": kernels_policy.name,
                              "threads": torch.get_num_threads(),
                              "machine": kernels.machine.describe(), "native_matmul": kernels.paths.native_matmul,
                              **asdict(workload), "engine_setup_s": round(engine_setup_s, 2),
                              "hf_setup_s": round(hf_setup_s, 2)}
    for batch in workload.batch_sizes:
        # rounds of at least one full batch, at least two rounds when the work allows
        round_size = max(batch, min(8, workload.num_prompts // 2) if batch == 1 else batch)
        totals = {"engine": [0.0, 0], "hf": [0.0, 0]}
        round_ratios = []
        for lo in range(0, len(prompts), round_size):
            chunk = prompts[lo : lo + round_size]
            e_s, e_n = time_engine(engine, chunk, batch, workload.max_tokens)
            h_s, h_n = time_hf(hf_model, pad_id, chunk, batch, workload.max_tokens)
            totals["engine"][0] += e_s
            totals["engine"][1] += e_n
            totals["hf"][0] += h_s
            totals["hf"][1] += h_n
            round_ratios.append((e_n / e_s) / (h_n / h_s))
        engine_tps = totals["engine"][1] / totals["engine"][0]
        hf_tps = totals["hf"][1] / totals["hf"][0]
        result[f"engine_tps_bs{batch}"] = round(engine_tps, 2)
        result[f"hf_tps_bs{batch}"] = round(hf_tps, 2)
        result[f"speedup_bs{batch}"] = round(engine_tps / hf_tps, 3)
        result[f"median_round_speedup_bs{batch}"] = round(statistics.median(round_ratios), 3)
        result[f"generated_tokens_bs{batch}"] = totals["engine"][1]
        if batch == 1:
            # what a batch-1 step costs each side beside the floor they share (prefill included in both)
            floor = weights_pass_ms(hf_model)
            result["weights_pass_ms"] = round(floor, 4)  # a tiny model's pass takes ~0.05 ms
            result["engine_ms_per_token_bs1"] = round(1000 / engine_tps, 4)
            result["hf_ms_per_token_bs1"] = round(1000 / hf_tps, 4)
            result["hf_over_floor_bs1"] = round(1000 / hf_tps / floor, 3)
        if totals["engine"][1] != totals["hf"][1]:
            raise RuntimeError(f"unequal work at batch {batch}: engine {totals['engine'][1]}, hf {totals['hf'][1]}")
    return result


def main(json_out: bool = False, quick: bool = False, device: Device = CPU, model: str = "smollm2",
         kernels: KernelPolicy = NATIVE) -> None:
    """`model`: one model, or several separated by commas, measured one after the other in this process (e.g.
    smollm2,gemma3-270m: each family's ratio to `generate` on the same box); one JSON line either way."""
    names = [m.strip() for m in model.split(",") if m.strip()]
    results = [run_benchmark(name, QUICK if quick else FULL, device=device, kernels_policy=kernels) for name in names]
    line = results[0] if len(results) == 1 else {"models": results}
    if not json_out:
        for result in results:
            print(f"{result['model']}:")
            for batch in (1, 16):
                print(
                    f"  batch {batch:>2}: engine {result[f'engine_tps_bs{batch}']:8.1f} tok/s   "
                    f"transformers {result[f'hf_tps_bs{batch}']:8.1f} tok/s   speedup x{result[f'speedup_bs{batch}']}"
                )
            print(f"  batch 1 per token: engine {result['engine_ms_per_token_bs1']} ms, transformers "
                  f"{result['hf_ms_per_token_bs1']} ms; streaming the weights once: {result['weights_pass_ms']} ms "
                  f"(the most an engine on the same GEMM could gain at batch 1: x{result['hf_over_floor_bs1']})")
    print(json.dumps(line))
