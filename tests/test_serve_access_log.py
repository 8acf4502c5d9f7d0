"""`flakecheck serve`'s access log: one line per request with method, path, status, latency, and a
generation's response id and token counts as its response reports them; never a body, a header, a key or a
query string. Served by the real app on a loopback port (tiny wide model)."""

from __future__ import annotations

import io
import json
import re

import httpx

from flakecheck.serve.app import build_app
from flakecheck.serve.server import BackgroundServer
from flakecheck.serve.state import ServeSettings, build_state
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import SERVED_NAME

SECRET, MARKER = "sk-do-not-log-4711", "MARKER-in-the-body"
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}) "
                  r"(?P<seconds>\d+\.\d{3})s id=(?P<id>\S+) prompt_tokens=(?P<prompt>\S+) "
                  r"completion_tokens=(?P<completion>\S+)$")


def test_one_line_per_request_with_what_the_response_said_and_nothing_secret(serve_model) -> None:
    log = io.StringIO()
    state = build_state(ServeSettings.parse(model=SERVED_NAME, kernels="invariant", max_num_seqs=4), serve_model)
    headers = {"Authorization": f"Bearer {SECRET}"}
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": MARKER}], "max_tokens": 5}
    with BackgroundServer(build_app(state, log)) as url, httpx.Client(base_url=url, timeout=60,
                                                                       headers=headers) as client:
        answer = client.post("/v1/chat/completions", json=chat).json()
        with client.stream("POST", "/v1/completions", json={"model": SERVED_NAME, "prompt": MARKER,
                                                             "max_tokens": 4, "stream": True,
                                                             "stream_options": {"include_usage": True}}) as stream:
            chunks = [line for line in stream.iter_lines() if line.startswith("data: {")]
        refused = client.post("/v1/chat/completions", json={**chat, "temperature": 0.7})
        client.get("/v1/models", params={"api_key": SECRET})
        client.get("/no/such/route")
    text = log.getvalue()
    assert SECRET not in text and MARKER not in text and "api_key" not in text
    lines = [LINE.match(line) for line in text.splitlines()]
    assert all(lines) and len(lines) == 5
    first, streamed, bad, models, missing = lines
    assert (first["method"], first["path"], first["status"]) == ("POST", "/v1/chat/completions", "200")
    assert first["id"] == answer["id"]
    assert int(first["prompt"]) == answer["usage"]["prompt_tokens"]
    assert int(first["completion"]) == answer["usage"]["completion_tokens"]
    usage = [json.loads(c.removeprefix("data: ")).get("usage") for c in chunks]
    assert int(streamed["completion"]) == next(u for u in usage if u)["completion_tokens"]
    assert (streamed["path"], streamed["status"]) == ("/v1/completions", "200")
    assert bad["status"] == str(refused.status_code) == "400"
    assert (models["path"], models["status"], models["id"]) == ("/v1/models", "200", "-")
    assert missing["status"] == "404"
