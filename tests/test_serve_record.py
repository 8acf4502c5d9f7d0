"""`flakecheck serve --record-responses`: one line per answer with every token and its top-2 logprobs, whether or
not the client asked for logprobs, keyed by the prompt's hash; what a logprobs request returns is the same."""

from __future__ import annotations

import io
import json

import httpx

from flakecheck.serve.app import build_app
from flakecheck.serve.response_record import prompt_sha256
from flakecheck.serve.server import BackgroundServer
from flakecheck.serve.state import ServeSettings, build_state
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import SERVED_NAME

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def test_each_answer_is_recorded_with_its_tokens_and_top2_logprobs(serve_model) -> None:
    record = io.StringIO()
    state = build_state(ServeSettings.parse(model=SERVED_NAME, kernels="invariant"), serve_model)
    with BackgroundServer(build_app(state, None, record)) as url:
        plain = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                           json={"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 8}).json()
        with_lp = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                             json={"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 8, "logprobs": True,
                                   "top_logprobs": 2}).json()
        raw = httpx.post(f"{url}/v1/completions", timeout=60,
                         json={"model": SERVED_NAME, "prompt": ["a b", "c d"], "max_tokens": 4}).json()
    lines = [json.loads(line) for line in record.getvalue().splitlines()]
    assert [(line["api"], line["choice"]) for line in lines] == [("chat", 0), ("chat", 0), ("completions", 0),
                                                                  ("completions", 1)]
    first, second = lines[0], lines[1]
    assert first["id"] == plain["id"] and first["text"] == plain["choices"][0]["message"]["content"]
    assert first["prompt_sha256"] == prompt_sha256(MESSAGES) == second["prompt_sha256"]
    # the tokens a logprobs request gets back, with the same logprobs and runner-up
    content = with_lp["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in second["tokens"]] == [c["token"] for c in content]
    assert [t["logprob"] for t in second["tokens"]] == [c["logprob"] for c in content]
    assert [t["top2"]["logprob"] for t in second["tokens"]] == [c["top_logprobs"][1]["logprob"] for c in content]
    assert all(t["logprob"] >= t["top2"]["logprob"] for t in first["tokens"])
    assert [line["prompt_sha256"] for line in lines[2:]] == [prompt_sha256("a b"), prompt_sha256("c d")]
    assert [line["text"] for line in lines[2:]] == [c["text"] for c in raw["choices"]]


def test_an_unwritable_record_is_refused_before_the_model_loads(tmp_path, capsys) -> None:
    from tests.harness_helpers import run_cli

    target = tmp_path / "no-such-dir" / "record.jsonl"
    code, _, err = run_cli(capsys, "serve", "--model", str(tmp_path / "no-model"), "--port", "0",
                           "--record-responses", target)
    assert code == 2 and "--record-responses" in err and str(target) in " ".join(err.split())
