"""What each candidate fix costs, measured on the spot with short timings of the engine in both settings
(the kernel benchmark's helpers: one engine step timed in turns, medians).

- fixed-order kernels: one decode step under the fixed policy vs the run's own, at every batch size the run's
  compositions use (1 always included); the factor is the geometric mean of the time ratios;
- serial requests: decode throughput at batch 1 vs at each batched composition's batch size, under the run's
  kernels (tokens a step / step time); the factor is how many times longer the same load takes;
- each composition axis's fixes, as its file in flakecheck/data/axes/ prices them with the measurements a
  `Pricer` offers: no prefix cache (the first prompts in arrival order prefilled with and without the cache,
  and the share of prompt tokens it served), no chunked prefill (one step prefilling the suite's longest
  prompt whole vs one chunk of it: the longest a decode sharing that step waits), a pinned TP size (no compute
  cost: a deployment choice).

The factors measure different work, on this machine and backend (on a CPU the split-K twins are themselves
slower than fixed order, unlike on a GPU); each row says what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from statistics import geometric_mean
from typing import Any

from flakecheck.bench.kernels import engine_step, interleaved
from flakecheck.data.axes.prefix_cache import PREFIX_SAMPLE
from flakecheck.data.compositions import arrival_order
from flakecheck.engine import LLMEngine, LoadedModel, Request, SamplingParams
from flakecheck.engine.models import CausalLM
from flakecheck.explain.fixes import Cost, fixes_for, offering_axes
from flakecheck.explain.source import RunSource
from flakecheck.replay.requests import knobs


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
    pricer = _Pricer(source, model, network, repeats)
    for axis in offering_axes(source):  # each axis prices its own fixes (flakecheck/data/axes/)
        for fix_id, (factor, text) in axis.price(pricer, compositions).items():
            costs.setdefault(fix_id, Cost(factor, text))
    return costs


class _Pricer:
    """The measurements a composition axis prices its fix with (flakecheck.data.axes.base.Pricer)."""

    def __init__(self, source: RunSource, model: LoadedModel, network: CausalLM, repeats: int) -> None:
        self.source, self.model, self.network, self.repeats = source, model, network, repeats
        self.engine: LLMEngine | None = None

    def prefill(self, composition: Any, **changed: Any) -> tuple[float, int, int]:
        if self.engine is None:
            self.engine = LLMEngine(self.model, network=self.network)
        requests = self.source.requests
        order = arrival_order(len(requests), composition, 0)[:PREFIX_SAMPLE]
        self.engine.configure(replace(knobs(composition), **changed))
        t0 = time.perf_counter()
        self.engine.generate([Request(requests[i].case_id, requests[i].prompt_ids, SamplingParams(1)) for i in order])
        took = time.perf_counter() - t0
        return took, self.engine.stats.prefix_hit_tokens, self.engine.stats.prompt_tokens

    def longest_prompt(self) -> int:
        return max(len(r.prompt_ids) for r in self.source.requests)

    def step_seconds(self, shapes: Mapping[str, tuple[int, int, int]]) -> dict[str, float]:
        return interleaved({name: engine_step(self.network, self.model, *shape) for name, shape in shapes.items()},
                           self.repeats)
