"""A run's row store (flakecheck/replay/row_share.py): rows one lockstep computed are loaded, not computed, by a
later lockstep that needs them — and every trace is bit for bit the trace computed without the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakecheck.analysis.flip.server_load import parse_load, sample_compositions
from flakecheck.data.compositions import Composition
from flakecheck.data.traces import Trace
from flakecheck.engine import LoadedModel, load_model
from flakecheck.engine.llm_engine import build_model
from flakecheck.replay import CaseRequest
from flakecheck.replay.row_share import RowStore
from flakecheck.replay.simulated import simulate
from tests.machine_paths import engine_ops


@pytest.fixture(scope="module")
def wide(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


def rounds(model: LoadedModel, store: RowStore | None) -> list[Trace]:
    """Two rounds of draws, as `run --sample auto` replays them (one lockstep each), the serial reference in both."""
    network = build_model(model, engine_ops("splitk", model.config))
    system = [7, 3, 9, 11, 2, 5, 8, 13] * 4  # a shared system prompt: draws prefill it under common plans
    cases = [CaseRequest(f"c{i}", system + [20 + i] * (3 + 2 * i), 5) for i in range(5)]
    draws = sample_compositions(parse_load("poisson:4"), 6, 11)
    traces: list[Trace] = []
    with RowStore.active(store):
        for work in ([Composition("solo"), *draws[:3]], [Composition("solo"), *draws[3:]]):
            simulate(model, network, cases, [(c, 0) for c in work], traces.append, lambda run: None)
    return sorted(traces, key=lambda t: (t.composition, t.case_id))


@pytest.fixture(scope="module")
def alone(wide) -> list[Trace]:
    return rounds(wide, None)


def test_rows_loaded_from_the_store_give_the_bits_computed_rows_give(wide, alone) -> None:
    store = RowStore()
    shared = rounds(wide, store)
    # the property means something only if the second round took rows the first computed
    assert store.stats.loaded > 0 and store.stats.stored > 0
    assert len(shared) == len(alone) == 5 * 8
    for a, b in zip(shared, alone):
        assert (a.composition, a.case_id) == (b.composition, b.case_id)
        assert list(a.token_ids) == list(b.token_ids)
        for field in ("top1_ids", "top2_ids", "top1_logprobs", "top2_logprobs", "top1_logits"):
            assert list(getattr(a, field)) == list(getattr(b, field)), (a.composition, a.case_id, field)


def test_a_full_store_keeps_what_it_can_and_computes_the_rest(wide, alone) -> None:
    store = RowStore(max_rows=16)
    assert rounds(wide, store) == alone
    assert len(store.rows) == 16 and store.stats.full > 0
