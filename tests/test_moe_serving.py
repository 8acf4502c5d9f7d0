"""Routed experts over the wire: `flakecheck serve` returns a mixture of experts' routing in a choice's
`routed_experts` as vLLM does (base64 .npy [tokens, layers, k]), the rows that chose each generated token;
`flakecheck probe` reads the field (a fake vLLM-like server stands in, returning the prompt's rows too) and
reports, per case and load level, the first step whose experts differ from the reference level's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from flakecheck.data.routing import (
    decode_routed_experts,
    encode_routed_experts,
    routing_digest,
    routing_divergence,
)
from flakecheck.engine import LLMEngine, Request, SamplingParams, encode_prompt, load_model
from flakecheck.kernels.policy import parse_policy
from flakecheck.kernels.registry import get_ops
from flakecheck.probe import ProbeConfig, probe_suite
from flakecheck.probe.parse import AnswerError, parse_answer
from flakecheck.reports.markdown import render_markdown
from tests.fixtures_serve import start_server
from tests.probe_fakes import Behaviour, Record, ThreadedServer, make_app
from tests.test_probe_fake_server import QUESTIONS, write_suite


def test_serve_returns_the_experts_the_engine_chose(tiny_model_factory) -> None:
    model = load_model(str(tiny_model_factory("mixtral")), "bfloat16")
    prompt = "A note on rivers:"
    with start_server(model, kernels="invariant") as served:
        body = httpx.post(f"{served.url}/v1/completions", json={"model": "tiny-wide", "prompt": prompt,
                                                                 "max_tokens": 5, "temperature": 0}, timeout=60).json()
        chat = httpx.post(f"{served.url}/v1/chat/completions", timeout=60, json={
            "model": "tiny-wide", "messages": [{"role": "user", "content": prompt}], "max_tokens": 3,
            "temperature": 0}).json()
    rows = decode_routed_experts(body["choices"][0]["routed_experts"])
    engine = LLMEngine(model, get_ops(parse_policy("invariant")))
    [alone] = engine.generate([Request(0, encode_prompt(model, prompt), SamplingParams(5, ignore_eos=True))])
    assert alone.routing is not None
    assert len(rows) == 5 and all(len(row) == 2 and all(len(layer) == 2 for layer in row) for row in rows)
    assert rows == [[list(layer) for layer in r.experts] for r in alone.routing]  # invariant: the same experts
    assert len(decode_routed_experts(chat["choices"][0]["routed_experts"])) == 3


def test_a_dense_model_is_served_without_the_field(tiny_model_dir) -> None:
    with start_server(load_model(str(tiny_model_dir), "bfloat16"), kernels="invariant") as served:
        body = httpx.post(f"{served.url}/v1/completions", json={"model": "tiny-wide", "prompt": "Hi", "max_tokens": 2,
                                                                 "temperature": 0}, timeout=60).json()
    assert "routed_experts" not in body["choices"][0]


@pytest.mark.parametrize("bad", ["not base64!", "AAAA", encode_routed_experts([[1, 2]])])  # the last: 2-D
def test_unreadable_routed_experts_are_a_named_answer_error(bad: str) -> None:
    body = {"choices": [{"text": "x", "finish_reason": "length", "routed_experts": bad}]}
    with pytest.raises(AnswerError, match="routed_experts"):
        parse_answer(body, "completions", with_logprobs=False)


def test_probe_reports_where_a_servers_experts_diverge_across_load_levels(tmp_path: Path) -> None:
    behaviour, record = Behaviour(routed_experts=True), Record()
    with ThreadedServer(make_app(behaviour, record)) as server:
        run = probe_suite(ProbeConfig(write_suite(tmp_path / "s.jsonl"), server.url, out=tmp_path / "run",
                                      html=False, concurrency=(1, 8)))
    assert record.max_in_flight >= 8
    n = dict(zip(run.runs.case_id + run.runs.composition, run.runs.n_tokens))

    def digests(level: str, case_id: str) -> list[int]:
        [text] = [t for salt, t in record.routed.items() if salt.endswith(f"-{level}-0-{case_id}")]
        rows = decode_routed_experts(text)
        return [routing_digest(row) for row in rows[len(rows) - n[case_id + level]:]]

    expected = {(f"q{i}", level): routing_divergence(digests("c1", f"q{i}"), digests(level, f"q{i}"))
                for i in range(len(QUESTIONS)) for level in ("c1", "c8")}
    reported = {(r.case_id, r.composition): (None if r.routing_divergence != r.routing_divergence
                                             else int(r.routing_divergence)) for r in run.runs.itertuples()}
    assert reported == expected
    rerouted = {case for (case, level), step in expected.items() if step is not None}
    assert rerouted, "the fake's routers near a tie should swap an expert under load"
    if run.cases.first_divergence.notna().any():
        assert f"other experts in {len(rerouted)} of {len(QUESTIONS)} cases" in render_markdown(run)
