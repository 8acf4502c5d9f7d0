"""Rows that are the same computation run once in a simulated forward pass, and every sequence still gets
the bits it gets alone: rows are identified by what they are computed from (token, position, the keys
and values before them, the plan), nothing else."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from flakecheck.engine import Completion, EngineCore, LLMEngine, LoadedModel, Request, SamplingParams, load_model
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.llm_engine import build_model
from flakecheck.engine.prefix_cache import CachedBlock, PrefixCache, block_hashes
from flakecheck.engine.sequence import LINEAGE_ROOT, Sequence
from flakecheck.kernels import StepPlan
from flakecheck.replay.lockstep import Lockstep, Member
from flakecheck.replay.requests import FillerId, readable_blocks, shape_from
from flakecheck.replay.shared_rows import RowSharing
from tests.machine_paths import engine_ops

PLAN = StepPlan(projections=(((64, 64), 2),), lm_head=3, kv_split=256, norms=((1, 1),), final=1)


def sequence(tokens: list[int]) -> Sequence:
    return Sequence("s", tokens, SamplingParams(max_tokens=4))


def test_a_rows_digest_follows_its_tokens_positions_and_plan_but_not_the_sampling_orders() -> None:
    sharing = RowSharing(KVCache(1, 2, 1, 4, torch.float32))
    a, b = sequence([5, 6, 7, 8]), sequence([5, 6, 7, 8])
    assert sharing.digests(a, 4, PLAN) == sharing.digests(b, 4, PLAN)
    # the LM head and final norm orders shape only what a sampling row samples, not keys and values
    assert sharing.digests(b, 4, replace(PLAN, lm_head=5, final=4)) == sharing.digests(a, 4, PLAN)
    assert sharing.digests(b, 4, replace(PLAN, kv_split=64))[0] != sharing.digests(a, 4, PLAN)[0]
    assert sharing.digests(b, 4, replace(PLAN, projections=(((64, 64), 1),)))[0] != sharing.digests(a, 4, PLAN)[0]
    # one earlier token differs: every later row differs too, though its own token is the same
    other = sharing.digests(sequence([9, 6, 7, 8]), 4, PLAN)
    assert all(x != y for x, y in zip(other, sharing.digests(a, 4, PLAN)))


def test_a_prompt_chunked_under_one_plan_has_the_lineage_of_the_whole_prompt() -> None:
    """Row-invariant kernels give a row the same bits whether its prompt was computed in one step or two
    (same plan): the digests agree, so the rows are shared either way."""
    sharing = RowSharing(KVCache(1, 2, 1, 4, torch.float32))
    whole = sharing.digests(sequence([5, 6, 7, 8]), 4, PLAN)
    chunked = sequence([5, 6, 7, 8])
    first = sharing.digests(chunked, 2, PLAN)
    chunked.lineage.extend(first)
    chunked.num_computed = 2
    assert first + sharing.digests(chunked, 2, PLAN) == whole


def test_keys_and_values_of_unknown_origin_match_nothing() -> None:
    sharing = RowSharing(KVCache(1, 2, 1, 4, torch.float32))
    a, b = sequence([5, 6, 7, 8]), sequence([5, 6, 7, 8])
    for seq in (a, b):  # e.g. prefix-cache blocks written by an engine that tracks no lineage
        seq.num_computed, seq.lineage = 2, [None, None]
    assert sharing.digests(a, 2, PLAN) != sharing.digests(b, 2, PLAN)


def admitted_lineage(blocks: list[CachedBlock], prompt: list[int]) -> bytes | None:
    """The lineage a request gets at its last cached position when its prompt's first blocks are `blocks`."""
    cache, prefix = KVCache(1, 2, 1, 4, torch.float32, length=64), PrefixCache()
    for key, block in zip(block_hashes(prompt, prefix.block_size), blocks):
        prefix.insert(key, block)
    core = EngineCore(cache, frozenset(), 64, 1, None, prefix)
    core.add_request(Request("r", prompt, SamplingParams(max_tokens=1)))
    ((seq, _),) = core.propose()
    assert seq.num_computed == 16 * len(blocks)
    return seq.lineage[-1]


def test_cached_blocks_hand_on_a_lineage_only_when_they_are_one_computation() -> None:
    """Blocks written by different computations (block 0 by one request, block 1 by another that computed
    its own block 0 under another plan) are no single computation: their lineage is unknown."""
    kv = torch.zeros(1, 2, 16, 1, 4)
    a0, a1, b0, b1 = (bytes([i]) * 16 for i in range(1, 5))
    prompt = list(range(3, 40))
    assert admitted_lineage([CachedBlock(kv, a0, LINEAGE_ROOT), CachedBlock(kv, a1, a0)], prompt) == a1
    assert admitted_lineage([CachedBlock(kv, a0, LINEAGE_ROOT), CachedBlock(kv, b1, b0)], prompt) is None
    assert admitted_lineage([CachedBlock(kv, None, LINEAGE_ROOT)], prompt) is None


@pytest.fixture(scope="module")
def wide(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    system = torch.randint(3, 200, (24,), generator=gen).tolist()  # a shared system prompt
    return [system + torch.randint(3, 200, (5 + 3 * i,), generator=gen).tolist() for i in range(n)]


def alone(model: LoadedModel, requests: list[Request], max_num_seqs: int, prefix: bool = False) -> list[Completion]:
    engine = LLMEngine(model, engine_ops("splitk", model.config), max_num_seqs=max_num_seqs,
                       enable_prefix_caching=prefix)
    return engine.generate(requests)


def same(a: Completion, b: Completion) -> bool:
    return (a.token_ids, a.top1_logprobs, a.top2_ids, a.top2_logprobs, a.top1_logits) == \
        (b.token_ids, b.top1_logprobs, b.top2_ids, b.top2_logprobs, b.top1_logits)


@pytest.mark.parametrize("max_rows", [2048, 40])
def test_cores_that_compute_the_same_rows_compute_them_once_with_the_bits_of_each_alone(wide, max_rows) -> None:
    """Two serial cores with one request each (the same), a serial core with a prefix cache, and a batched
    core: the duplicate core computes nothing, rows are shared, and every completion is bitwise what its
    core gives when replayed alone. With 40 rows a pass, a step's shared rows come from earlier passes
    (copied from the computing sequence's slot) rather than from the same pass."""
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    ps = prompts(3)
    network = build_model(wide, engine_ops("splitk", wide.config))
    config = wide.config
    cache = KVCache(config.num_layers, 16, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(network, cache, max_rows)
    results: dict[str, list[Completion]] = {}

    shared_prefix = PrefixCache()  # the serial prefix-cache composition's requests share one cache

    def core(name: str, requests: list[Request], max_num_seqs: int, prefix: bool = False,
             ready=lambda: True) -> EngineCore:
        engine = EngineCore(cache, wide.eos_token_ids, config.max_context, max_num_seqs, None,
                            shared_prefix if prefix else None)
        for request in requests:
            engine.add_request(request)
        lockstep.add(Member(engine, results.setdefault(name, []).append, ready))
        return engine

    one = [Request("a", ps[0], params)]
    core("serial-1", one, 1)
    core("serial-2", one, 1)  # the same computation: shares every row
    batched = [Request(str(i), p, params) for i, p in enumerate(ps)]
    core("batched", batched, 4)
    first = core("prefix-first", [Request("p0", ps[0], params)], 1, prefix=True)
    # waits until the first has written its prompt's blocks, then hits them (shared system prompt)
    core("prefix-second", [Request("p1", ps[1], params)], 1, prefix=True, ready=first.prompts_done)
    lockstep.run()

    assert same(results["serial-1"][0], alone(wide, one, 1)[0])
    assert same(results["serial-2"][0], results["serial-1"][0])
    for got, want in zip(sorted(results["batched"], key=lambda c: c.request_id), alone(wide, batched, 4)):
        assert same(got, want)
    serial_prefix = alone(wide, [Request("p0", ps[0], params), Request("p1", ps[1], params)], 1, prefix=True)
    assert [c.cached_prompt_tokens for c in serial_prefix] == [0, 16]
    assert same(results["prefix-first"][0], serial_prefix[0])
    assert same(results["prefix-second"][0], serial_prefix[1])
    assert results["prefix-second"][0].cached_prompt_tokens == 16
    # the duplicate serial core and the prefix-cache core's first request compute nothing of their own
    one_core_rows = len(ps[0]) + params.max_tokens - 1
    assert lockstep.stats.shared_rows >= 2 * one_core_rows
    computed = lockstep.stats.rows
    every_row = 3 * one_core_rows + sum(len(p) + params.max_tokens - 1 for p in ps) + (len(ps[1]) - 16 + 5)
    assert computed + lockstep.stats.shared_rows == every_row


def test_a_shape_only_request_shapes_its_steps_without_being_computed(wide) -> None:
    """A filler (fixed length, no prefix cache) changes its batch-mates' plans, never their values: skipping
    its rows leaves every case bitwise what the engine gives with the filler computed."""
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    ps = prompts(3)
    cases = [Request(str(i), p, params) for i, p in enumerate(ps[:2])]
    filler = Request(("filler", 0), ps[2][::-1], SamplingParams(max_tokens=7, ignore_eos=True), arrival=2)
    want = alone(wide, [*cases, filler], 4)
    config = wide.config
    cache = KVCache(config.num_layers, 8, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(build_model(wide, engine_ops("splitk", wide.config)), cache)
    core = EngineCore(cache, wide.eos_token_ids, config.max_context, 4)
    for request in [*cases, replace(filler, shape_from=0)]:
        core.add_request(request)
    got: list[Completion] = []
    lockstep.add(Member(core, got.append))
    lockstep.run()
    by_id = {c.request_id: c for c in got}
    for completion in want[:2]:
        assert same(by_id[completion.request_id], completion)
    assert len(by_id[("filler", 0)].token_ids) == 7  # it ran its whole length, uncomputed
    assert lockstep.stats.skipped_rows == len(filler.prompt_ids) + 7 - 1


def test_under_a_prefix_cache_a_filler_computes_only_the_prompt_blocks_a_case_can_load(wide) -> None:
    """Fillers that arrive first publish their prompts' blocks; the cases share the first block (the system
    prompt) with one of them and load it. That filler computes that block and nothing after it, the other (no
    block shared) nothing at all; the cases get the bits they get with both fillers computed in full, hits
    included."""
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    ps = prompts(3)
    long = SamplingParams(max_tokens=7, ignore_eos=True)
    fillers = [Request(FillerId(0), ps[2], long), Request(FillerId(1), ps[2][::-1], long)]
    cases = [Request(str(i), p, params, arrival=2) for i, p in enumerate(ps[:2])]
    want = alone(wide, [*fillers, *cases], 4, prefix=True)
    assert [c.cached_prompt_tokens for c in want[2:]] == [16, 16]  # the cases load filler 0's first block
    readable = readable_blocks([*fillers, *cases])
    assert [shape_from(f, readable) for f in fillers] == [16, 0] and shape_from(cases[0], readable) is None
    config = wide.config
    cache = KVCache(config.num_layers, 8, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(build_model(wide, engine_ops("splitk", wide.config)), cache)
    core = EngineCore(cache, wide.eos_token_ids, config.max_context, 4, None, PrefixCache())
    for request in [*fillers, *cases]:
        core.add_request(replace(request, shape_from=shape_from(request, readable)))
    got: list[Completion] = []
    lockstep.add(Member(core, got.append))
    lockstep.run()
    by_id = {c.request_id: c for c in got}
    for completion in want[2:]:
        assert same(by_id[completion.request_id], completion)
        assert by_id[completion.request_id].cached_prompt_tokens == 16
    assert all(len(by_id[f.request_id].token_ids) == 7 for f in fillers)  # they ran their whole length
    # every filler row but filler 0's first block (the last sampled token of each has no row)
    assert lockstep.stats.skipped_rows == (len(ps[2]) - 16 + 6) + (len(ps[2]) + 6)


def test_rows_are_handed_on_by_any_sequence_that_still_holds_them(wide) -> None:
    """Three serial cores with the same prompt and two KV slots: the first computes the prompt and finishes,
    the second shared its rows and runs longer; the third, admitted in the first's slot, copies every row from
    the second (the first no longer holds them) and computes nothing, with the bits it gets alone."""
    ps = prompts(1)
    short, third, longer = (SamplingParams(max_tokens=n, ignore_eos=True) for n in (1, 6, 9))
    config = wide.config
    cache = KVCache(config.num_layers, 2, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(build_model(wide, engine_ops("splitk", wide.config)), cache)
    results: dict[str, list[Completion]] = {}
    for name, params in (("first", short), ("second", longer), ("third", third)):
        core = EngineCore(cache, wide.eos_token_ids, config.max_context, 1)
        core.add_request(Request(name, ps[0], params))
        lockstep.add(Member(core, results.setdefault(name, []).append))
    lockstep.run()

    assert same(results["third"][0], alone(wide, [Request("third", ps[0], third)], 1)[0])
    assert same(results["second"][0], alone(wide, [Request("second", ps[0], longer)], 1)[0])
    # computed: the prompt once and the second's decode rows; the third's rows were all the second's
    assert lockstep.stats.rows == len(ps[0]) + longer.max_tokens - 1
    assert lockstep.stats.shared_rows == len(ps[0]) + (len(ps[0]) + third.max_tokens - 1)


def test_a_step_that_computes_nothing_does_not_wait_for_a_forward_pass(wide) -> None:
    """Core A runs a shape-only filler alone for 3 steps before its case arrives; core B's case starts at once.
    A's filler-only steps need no pass, so both cases' steps share passes: as many as the longer case has
    steps (4), not the 7 ticks their spread covers — and every case keeps the bits its core gives alone."""
    ps = prompts(3)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    filler = Request(("filler", 0), ps[2][::-1], SamplingParams(max_tokens=6, ignore_eos=True))
    case_a, case_b = Request("a", ps[0], params, arrival=3), Request("b", ps[1], params)
    config = wide.config
    cache = KVCache(config.num_layers, 8, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(build_model(wide, engine_ops("splitk", wide.config)), cache)
    got: list[Completion] = []
    for requests in ([replace(filler, shape_from=0), case_a], [case_b]):
        core = EngineCore(cache, wide.eos_token_ids, config.max_context, 4)
        for request in requests:
            core.add_request(request)
        lockstep.add(Member(core, got.append))
    lockstep.run()
    by_id = {c.request_id: c for c in got}
    assert same(by_id["a"], alone(wide, [filler, case_a], 4)[1])
    assert same(by_id["b"], alone(wide, [case_b], 4)[0])
    assert lockstep.stats.forward_passes == params.max_tokens


def test_a_step_run_at_once_never_frees_a_slot_a_packed_step_still_copies_from(wide) -> None:
    """Core X's case copies its prompt's rows from S, a filler of core Y that computed them a tick before. In
    that tick Y's next step computes nothing (S's uncomputed decode), runs at once and finishes S; Y then admits
    T into S's slot, loading another prompt's prefix-cache block there. X's copies must have been made first:
    its case gets the bits it gets alone."""
    gen = torch.Generator().manual_seed(11)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 200, (n,), generator=gen).tolist()

    p, q = tokens(29), tokens(24)
    once, twice = SamplingParams(max_tokens=1, ignore_eos=True), SamplingParams(max_tokens=2, ignore_eos=True)
    first, case = Request("d", tokens(20), twice), Request("c", p + tokens(3), SamplingParams(3, ignore_eos=True))
    config = wide.config
    cache = KVCache(config.num_layers, 2, config.num_kv_heads, config.head_dim, wide.dtype, length=128)
    lockstep = Lockstep(build_model(wide, engine_ops("splitk", wide.config)), cache)
    got: list[Completion] = []
    x = EngineCore(cache, wide.eos_token_ids, config.max_context, 1)
    for request in (first, case):  # the case prefills in tick 2
        x.add_request(request)
    y = EngineCore(cache, wide.eos_token_ids, config.max_context, 1, None, PrefixCache())
    # R publishes q's block (tick 0); S prefills p (tick 1), its decode only shapes; T loads q's block
    for request in (Request("r", q, once), Request(FillerId(0), p, twice, shape_from=len(p)),
                    Request("t", q + tokens(4), once)):
        y.add_request(request)
    lockstep.add(Member(x, got.append))
    lockstep.add(Member(y, got.append))
    lockstep.run()
    by_id = {c.request_id: c for c in got}
    assert by_id["t"].cached_prompt_tokens == 16 and lockstep.stats.shared_rows >= len(p)  # the setting holds
    assert same(by_id["c"], alone(wide, [first, case], 1)[1])
