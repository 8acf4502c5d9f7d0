"""`flakecheck bench kernels`: what each kernel policy costs on this machine.

For SmolLM2-135M (bf16, the torch backend), per op on the model's own shapes and for one whole
decode step of the model at batch 1, 16 and 64 (every sequence 128 tokens into its context),
the median time of each policy. Policies are timed interleaved in one process (native,
invariant, splitk, native, ...) so drift in machine load hits them alike. The last line is one
JSON object; `invariant_overhead` and `splitk_overhead` are the decode-step time over native's,
geometric mean over the batch sizes.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable

import torch

from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.llm_engine import build_model
from flakecheck.engine.loader import LoadedModel, load_model
from flakecheck.engine.model_runner import ModelRunner
from flakecheck.engine.models import probe_dims
from flakecheck.engine.sequence import SamplingParams, Sequence
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.kernels import AttentionLayout, Ops
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy
from flakecheck.machine.device import CPU, Device

POLICIES = ("native", "invariant", "splitk")
CONTEXT = 128


def main(json_out: bool = False, quick: bool = False, device: Device = CPU) -> None:
    """`device`: resolved (cpu or cuda:N); on a GPU the split-K and fixed-order orders run as Triton kernels."""
    batch_sizes, repeats = ((1, 16), 2) if quick else ((1, 16, 64), 5)
    torch.manual_seed(0)
    loaded = load_model("smollm2", "bfloat16", device)
    specs = {policy: resolve_engine(EngineSettings(policy=UNIFORM_POLICIES[policy], device=device),
                                    probe_dims(loaded.config)) for policy in POLICIES}
    ops = {policy: spec.ops() for policy, spec in specs.items()}
    models = {policy: build_model(loaded, o) for policy, o in ops.items()}
    fp32_bytes = _fp32_copy_bytes(models["splitk"])
    results: dict[str, dict[str, dict[str, float]]] = {}
    for batch in batch_sizes:
        cases = _op_cases(loaded, batch, device)
        cases["decode_step"] = lambda o, b=batch: engine_step(models[o.policy.name], loaded, b)
        for name, make in cases.items():
            timings = interleaved({p: make(ops[p]) for p in POLICIES}, repeats, device)
            results.setdefault(f"batch_{batch}", {})[name] = timings
            if not json_out:
                cells = "  ".join(f"{p} {timings[p] * 1e3:8.2f} ms" for p in POLICIES)
                print(f"batch {batch:3d}  {name:12s} {cells}", flush=True)
    ratios = {p: [results[f"batch_{b}"]["decode_step"][p] / results[f"batch_{b}"]["decode_step"]["native"]
                  for b in batch_sizes] for p in ("invariant", "splitk")}
    summary = {
        "bench": "kernels",
        "model": "smollm2",
        "dtype": "bfloat16",
        "backend": specs["invariant"].backend,
        "device": device,
        "threads": torch.get_num_threads(),
        "machine": specs["invariant"].machine.describe(),
        "paths": {policy: spec.paths.fallbacks() for policy, spec in specs.items()},
        "batch_sizes": list(batch_sizes),
        "repeats": repeats,
        "median_ms": {b: {op: {p: round(t * 1e3, 3) for p, t in per.items()} for op, per in ops_.items()}
                      for b, ops_ in results.items()},
        "fp32_weight_copy_mb": round(fp32_bytes / 2**20, 1),
        "invariant_overhead": round(_geomean(ratios["invariant"]), 3),
        "splitk_overhead": round(_geomean(ratios["splitk"]), 3),
    }
    print(json.dumps(summary))


def _fp32_copy_bytes(model) -> int:
    """The size of the fp32 weight copies a policy's model made when it was built."""
    linears = [model.lm_head.proj]
    for layer in model.layers:
        linears += [layer.attn.qkv, layer.attn.o_proj, layer.mlp.gate_up, layer.mlp.down]
    return sum(lin.weights.w32.numel() * 4 for lin in linears if lin.weights.w32 is not None)


def _op_cases(loaded: LoadedModel, batch: int, device: Device) -> dict[str, Callable[[Ops], Callable[[], object]]]:
    c, dtype = loaded.config, loaded.dtype
    layer = "model.layers.0."
    shapes = {
        "qkv": (c.num_heads + 2 * c.num_kv_heads) * c.head_dim,
        "o_proj": c.hidden_size,
        "gate_up": 2 * c.intermediate_size,
        "down": c.hidden_size,
        "lm_head": c.vocab_size,
    }
    cases: dict[str, Callable[[Ops], Callable[[], object]]] = {}
    for name, n in shapes.items():
        k = c.intermediate_size if name == "down" else (c.num_heads * c.head_dim if name == "o_proj" else c.hidden_size)
        x = torch.randn(batch, k, dtype=dtype, device=device)
        w = torch.randn(n, k, dtype=dtype, device=device) * k**-0.5

        def linear_case(o: Ops, x: torch.Tensor = x, w: torch.Tensor = w) -> Callable[[], object]:
            prepared = o.prepare_linear(w)  # what the model makes once, when it is built
            return lambda: o.linear(x, prepared)

        cases[name] = linear_case
    hidden = torch.randn(batch, c.hidden_size, dtype=dtype, device=device)
    norm_w = loaded.weights[f"{layer}input_layernorm.weight"]
    cases["rmsnorm"] = lambda o: (lambda: o.rmsnorm(hidden, norm_w, c.rms_norm_eps))
    logits = torch.randn(batch, c.vocab_size, dtype=dtype, device=device) * 4
    cases["log_softmax"] = lambda o: (lambda: o.log_softmax(logits))
    k_cache = torch.randn(batch, CONTEXT + 64, c.num_kv_heads, c.head_dim, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, c.num_heads, c.head_dim, dtype=dtype, device=device)
    attn = _decode_attention_batch(batch)
    cases["attention"] = lambda o: (lambda: o.attention(q, k_cache, v_cache, attn, c.head_dim**-0.5))
    return cases


def _decode_attention_batch(batch: int) -> AttentionLayout:
    return AttentionLayout.of([(slot, 1, CONTEXT) for slot in range(batch)])


def engine_step(model, loaded: LoadedModel, batch: int, query_len: int = 1, context: int = CONTEXT,
                policy: KernelPolicy | None = None) -> Callable[[], object]:
    """One engine step of `batch` sequences over a cache of random keys and values, each computing the last
    `query_len` of its `context` tokens (1: a decode step; `context`: a whole prompt's prefill), planned
    under `policy` (None: the model's own; else one its weights are prepared for)."""
    c = loaded.config
    cache = KVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, loaded.dtype, length=context + 64,
                    device=loaded.device)
    for t in cache.k + cache.v:
        t.normal_()
    # the engine's own packing, so the bench follows the engine's batch layout
    seqs = []
    for slot in range(batch):
        seq = Sequence(slot, [int(t) for t in torch.randint(0, c.vocab_size, (context,))], SamplingParams())
        seq.slot, seq.num_computed = slot, context - query_len
        seqs.append((seq, query_len))
    runner = ModelRunner(model, cache)
    step = runner.plan(seqs, policy)  # the engine's own planning and packing, timed with the forward pass

    return lambda: runner.forward([step])


def interleaved(calls: dict[str, Callable[[], object]], repeats: int, device: Device = CPU) -> dict[str, float]:
    """The median seconds of each call, the calls taking turns (after one warm-up each; on a GPU, Triton's
    compilation too, and each timing waits for the kernels it launched)."""
    sync = torch.cuda.synchronize if device.is_cuda else (lambda: None)
    for call in calls.values():  # warm-up: allocator, first-touch of caches
        call()
    sync()
    times: dict[str, list[float]] = {p: [] for p in calls}
    for _ in range(repeats):
        for policy, call in calls.items():
            t0 = time.perf_counter()
            call()
            sync()
            times[policy].append(time.perf_counter() - t0)
    return {p: statistics.median(ts) for p, ts in times.items()}


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
