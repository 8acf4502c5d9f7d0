"""What each candidate fix costs, measured on the spot with short timings of the engine in both settings
(the kernel benchmark's helpers: one engine step timed in turns, medians).

- fixed-order kernels: one decode step under the fixed policy vs the run's own, at every batch size the run's
  compositions use (1 always included); the factor is the geometric mean of the time ratios;
- serial requests: decode throughput at batch 1 vs at each batched composition's batch size, under the run's
  kernels (tokens a step / step time); the factor is how many times longer the same load takes;
- no prefix cache: the first PREFIX_SAMPLE prompts in the arrival order of each composition that caches
  prefixes, prefilled (one token generated) through the engine with and without the cache; the factor is the
  time ratio, and the share of prompt tokens the cache served is stated;
- no chunked prefill: one step prefilling the suite's longest prompt whole vs one chunk of it: the longest a
  decode sharing that step waits (the tokens computed are the same, so throughput barely moves).

The factors measure different work, on this machine and backend (on a CPU the split-K twins are themselves
slower than fixed order, unlike on a GPU); each row says what was measured.
"""

from __future__ import annotations

import time
from dataclasses import replace
from statistics import geometric_mean

from flakecheck.bench.kernels import engine_step, interleaved
from flakecheck.data.compositions import arrival_order
from flakecheck.engine import LLMEngine, LoadedModel, Request, SamplingParams
from flakecheck.engine.models import CausalLM
from flakecheck.explain.fixes import Cost, fixes_for
from flakecheck.explain.source import RunSource

PREFIX_SAMPLE = 16  # prompts prefilled twice to price the prefix cache (a serial prefill is slow on a CPU)


def measure_costs(source: RunSource, model: LoadedModel, network: CausalLM,
                  repeats: int = 3) -> dict[str, Cost]:
    compositions = [c for c, r in source.work if r == 0]
    batches = sorted({1} | {c.max_batch for c in compositions})
    kernel_fixes = [f for f in fixes_for(source) if f.kernels and replace(source.policy, **f.kernels) != source.policy]
    step_s: dict[int, dict[str, float]] = {}
    for batch in batches:
        calls = {"run": engine_step(network, model, batch)}
        for fix in kernel_fixes:
            calls[fix.id] = engine_step(network, model, batch, policy=replace(source.policy, **fix.kernels))
        step_s[batch] = interleaved(calls, repeats)
    costs: dict[str, Cost] = {}
    if any(f.pin_tp for f in fixes_for(source)):
        costs["pin_tp"] = Cost(None, "no compute cost here: a deployment choice (one TP size for every server the "
                                     "suite meets; a model that needs more ranks than a machine has cannot take it)")
    widest = batches[-1]
    for fix in kernel_fixes:
        factor = geometric_mean([step_s[b][fix.id] / step_s[b]["run"] for b in batches])
        costs[fix.id] = Cost(factor, f"decode step {factor:.2f}x the run's kernels' time (geometric mean over batch "
                                     f"{', '.join(map(str, batches))}; at batch {widest}: "
                                     f"{step_s[widest][fix.id] * 1e3:.0f} vs {step_s[widest]['run'] * 1e3:.0f} ms)")
    batched = [b for b in batches if b > 1]
    if batched:
        rate = {b: b / step_s[b]["run"] for b in batches}
        factor = geometric_mean([rate[b] / rate[1] for b in batched])
        shown = ", ".join(f"{rate[b]:.0f} at batch {b}" for b in batched)
        costs["serial"] = Cost(factor, f"decode throughput {rate[1]:.1f} tok/s at batch 1 vs {shown}: the same load "
                                       f"takes {factor:.1f}x as long (geometric mean)")
    cached = [c for c in compositions if c.prefix_cache]
    if cached:
        costs["no_prefix_cache"] = _prefix_cost(source, model, network, cached)
    chunked = sorted({c.chunk for c in compositions if c.chunk is not None})
    if chunked:
        costs["no_chunked_prefill"] = _chunk_cost(source, model, network, chunked[0], repeats)
    return costs


def _prefix_cost(source: RunSource, model: LoadedModel, network: CausalLM, cached: list) -> Cost:
    engine = LLMEngine(model, network=network)
    seconds = {True: 0.0, False: 0.0}
    hits = prompts = 0
    for composition in cached:
        order = arrival_order(len(source.requests), composition, 0)[:PREFIX_SAMPLE]
        requests = [Request(source.requests[i].case_id, source.requests[i].prompt_ids, SamplingParams(1))
                    for i in order]
        for use_cache in (False, True):
            engine.reconfigure(composition.max_batch, composition.chunk, use_cache)
            t0 = time.perf_counter()
            engine.generate(requests)
            seconds[use_cache] += time.perf_counter() - t0
            if use_cache:
                hits += engine.stats.prefix_hit_tokens
                prompts += engine.stats.prompt_tokens
    factor = seconds[False] / seconds[True]
    names = ", ".join(c.name for c in cached)
    return Cost(factor, f"the prefix cache served {hits / max(prompts, 1):.0%} of the prompt tokens of {names} "
                        f"({hits} of {prompts}, the first {PREFIX_SAMPLE} prompts in arrival order); prefilling them "
                        f"without it took {factor:.2f}x as long ({seconds[False]:.1f} vs {seconds[True]:.1f} s)")


def _chunk_cost(source: RunSource, model: LoadedModel, network: CausalLM, chunk: int, repeats: int) -> Cost:
    longest = max(len(r.prompt_ids) for r in source.requests)
    if longest <= chunk:
        return Cost(1.0, f"no prompt is longer than the {chunk}-token chunk: nothing is split")
    step_s = interleaved({"whole": engine_step(network, model, 1, longest, longest),
                          "chunk": engine_step(network, model, 1, chunk, longest)}, repeats)
    factor = step_s["whole"] / step_s["chunk"]
    return Cost(factor, f"the longest prompt ({longest} tokens) prefilled in one step takes "
                        f"{step_s['whole'] * 1e3:.0f} ms instead of {step_s['chunk'] * 1e3:.0f} ms for a "
                        f"{chunk}-token chunk ({factor:.1f}x): decodes sharing that step wait that long; the tokens "
                        "computed are the same")
