"""`flakecheck probe` against the real `flakecheck serve` (tiny wide random model, loopback port):
split-K kernels show batch variance that the probe reports where the tokens diverge; fixed-order
kernels show none, bitwise; a faulty network between them changes nothing."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd

from flakecheck.engine import LoadedModel
from flakecheck.probe import ProbeConfig, probe_suite
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import start_server
from tests.probe_fakes import FaultProxy
from tests.test_probe_fake_server import recomputed_first_divergence

TOPICS = ["the capital of France", "adding two numbers", "a JSON record for Ada", "the sea at morning",
          "primes below twenty", "a haiku about wind", "the letter A", "London in winter", "the number 42",
          "rivers and stones", "a function that adds", "the answer to a question"]


def write_suite(path: Path) -> Path:
    lines = []
    for i in range(3 * len(TOPICS)):
        topic = TOPICS[i % len(TOPICS)]
        text = f"Tell me about {topic}. " * (1 + i % 7)  # prompts of 10 to 100-odd tokens
        lines.append(json.dumps({"id": f"s{i}", "input": [{"role": "user", "content": text}], "max_tokens": 24}))
    for i, topic in enumerate(TOPICS[:3]):  # raw prompts: the completions route, texts from /detokenize
        lines.append(json.dumps({"id": f"raw{i}", "prompt": f"A note on {topic}:", "max_tokens": 24}))
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def serving(model: LoadedModel, kernels: str) -> Iterator[str]:
    """A server of its own (its /stats count only this test's requests), batches of up to 32."""
    with start_server(model, kernels=kernels, max_num_seqs=32) as served:
        yield served.url


def probe(suite: Path, url: str, out: Path):
    return probe_suite(ProbeConfig(suite, url, out=out, concurrency=(1, 8, 32), html=False))


def peak_batch(url: str) -> int:
    return int(httpx.get(f"{url}/stats").json()["peak_running_seqs"])


def test_splitk_server_diverges_under_load_where_the_tokens_do(serve_model, tmp_path: Path) -> None:
    with serving(serve_model, "splitk") as url:
        run = probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run")
        assert peak_batch(url) >= 8  # the server's own count: the load was batched, not queued
    diverged = run.cases[run.cases.status.isin(["flaky", "verdict_flaky"])]
    assert len(diverged) >= 1
    recomputed = recomputed_first_divergence(run.runs)
    for row in run.cases.itertuples():
        reported = None if pd.isna(row.first_divergence) else int(row.first_divergence)
        assert reported == recomputed[row.case_id]
    assert run.meta["server"]["token_ids"] == "server" and run.meta["server"]["version"]
    assert run.meta["server"]["api"] == {"chat": 36, "completions": 3}
    assert not run.tokens.token.str.startswith("token_id:").any()  # every token's text came back


def test_invariant_server_is_bitwise_identical_at_every_load_even_through_faults(serve_model, tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "s.jsonl")
    with serving(serve_model, "invariant") as url:
        clean = probe(suite, url, tmp_path / "clean")
        assert peak_batch(url) >= 8
        with FaultProxy(url) as proxy:
            faulty = probe(suite, proxy.url, tmp_path / "faulty")
    assert clean.runs.first_divergence.isna().all() and set(clean.cases.status) <= {"stable", "fragile"}
    per_step = clean.tokens.groupby(["case_id", "step"])
    assert (per_step.token_id.nunique() == 1).all()
    assert (per_step.top1_logprob.nunique() == 1).all() and (per_step.top2_logprob.nunique() == 1).all()
    assert proxy.faults["503"] + proxy.faults["drop before"] + proxy.faults["drop after"] > 0
    key = ["case_id", "composition", "repeat", "step"]
    a, b = clean.tokens.sort_values(key).reset_index(drop=True), faulty.tokens.sort_values(key).reset_index(drop=True)
    assert a[["token_id", "top1_logprob", "top2_id", "top2_logprob"]].equals(
        b[["token_id", "top1_logprob", "top2_id", "top2_logprob"]])
    assert clean.cases.status.tolist() == faulty.cases.status.tolist()


def test_a_serial_probe_of_serve_reproduces_the_simulated_solo_run_bitwise(serve_model, tmp_path: Path) -> None:
    import flakecheck
    from flakecheck.data.compositions import Composition

    suite = write_suite(tmp_path / "s.jsonl")
    with serving(serve_model, "splitk") as url:
        probed = probe_suite(ProbeConfig(suite, url, out=tmp_path / "probe", concurrency=(1,), html=False))
    simulated = flakecheck.run_suite(suite, model=serve_model, kernels="splitk", compositions=[Composition("solo")],
                                     out=tmp_path / "sim", html=False)
    key = ["case_id", "step"]
    a = simulated.tokens.sort_values(key).reset_index(drop=True)
    b = probed.tokens.sort_values(key).reset_index(drop=True)
    # the same engine, one sequence at a time: over HTTP, every token id and logprob comes back exactly
    assert len(a) == len(b) > 0
    for column in ("case_id", "step", "token_id", "top1_logprob", "top2_id", "top2_logprob"):
        assert a[column].tolist() == b[column].tolist(), column
    assert simulated.runs.sort_values("case_id").text.tolist() == probed.runs.sort_values("case_id").text.tolist()
