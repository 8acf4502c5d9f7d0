"""promptfoo itself (pinned in tools/promptfoo/package-lock.json) against `flakecheck serve` on a loopback port,
as its users run it: `promptfoo eval --repeat 3` at --max-concurrency 1 and at 8 over a small config (OpenAI
provider, apiBaseUrl, logprobs on), then `flakecheck import promptfoo` of both results files with the server's
--record-responses record, then `flakecheck gate`. Once against `--kernels splitk` (the tiny wide model, whose
reductions are long enough to split), once against `--kernels invariant`.

Checked, each against promptfoo's own files: the run has one case per test × prompt and promptfoo's verdict for
each (case, concurrency, repeat); a case is flaky exactly when its six answers are not all the same text;
every case was joined to the record (compared by token); a reported first divergence is where two answers'
recorded tokens part; the gate's --min-pass-rate 1 (pass^k) fails exactly the cases promptfoo did not pass in
every run; the assertion promptfoo ran as JavaScript leaves its case ungraded in the imported suite. Against
invariant kernels every answer of a case is the same and the gate with its strict defaults passes.

Needs tools/promptfoo/node_modules (`make promptfoo-setup`; `make test` runs it, so CI runs this and fails
without it); skipped elsewhere without it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import httpx
import pandas as pd
import pytest

from flakecheck.data.suite import load_suite
from flakecheck.serve.app import build_app
from flakecheck.serve.server import BackgroundServer
from flakecheck.serve.state import ServeSettings, build_state
from tests.fixtures_serve import *  # noqa: F403
from tests.fixtures_serve import SERVED_NAME
from tests.harness_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
PROMPTFOO = ROOT / "tools/promptfoo/node_modules/.bin/promptfoo"
TIMEOUT_S = 240  # a bound for a stuck eval, not a speed goal
# promptfoo must not phone home: no telemetry, no update check, no sharing, no remote generation
PROMPTFOO_ENV = {"PROMPTFOO_DISABLE_TELEMETRY": "1", "PROMPTFOO_DISABLE_UPDATE": "1",
                 "PROMPTFOO_DISABLE_SHARING": "1", "PROMPTFOO_DISABLE_REMOTE_GENERATION": "1",
                 "PROMPTFOO_DISABLE_REDTEAM_REMOTE_GENERATION": "1", "PROMPTFOO_DISABLE_RUNTIME_WARNINGS": "1",
                 # the adaptive scheduler may lower the concurrency asked for: 8 must mean 8
                 "PROMPTFOO_DISABLE_ADAPTIVE_SCHEDULER": "1", "OPENAI_API_KEY": "unused"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROMPTFOO.exists() and os.environ.get("CI") != "true",
                       reason="needs tools/promptfoo/node_modules: make promptfoo-setup"),
]

TOPICS = ["the capital of France", "adding two numbers", "a JSON record for Ada", "the sea at morning",
          "primes below twenty", "a haiku about wind", "the letter A", "London in winter", "the number 42",
          "rivers and stones", "a function that adds", "the answer to a question"]
# prompts of 10 to 100-odd tokens: varied lengths make varied batch shapes, where split-K's order changes
QUESTIONS = [f"Tell me about {topic}. " * (1 + i % 7) for i, topic in enumerate(TOPICS)]
CONFIG = """description: flakecheck promptfoo test
prompts:
  - label: plain
    raw: "{{{{question}}}}"
providers:
  - id: openai:chat:{model}
    config:
      apiBaseUrl: {url}/v1
      apiKey: unused
      max_tokens: 24
      temperature: 0
      logprobs: true
      top_logprobs: 2
tests:
{tests}
  - description: judged by code
    vars:
      question: Say something.
    assert:
      - type: javascript
        value: output.length > 3
"""


def config_text(url: str) -> str:
    tests = "".join(f"  - description: q{i}\n    vars:\n      question: {json.dumps(q)}\n    assert:\n"
                    f"      - type: icontains\n        value: {letter}\n"
                    for i, (q, letter) in enumerate(zip(QUESTIONS, "eaoi" * 3)))
    return CONFIG.format(model=SERVED_NAME, url=url, tests=tests)


def promptfoo_eval(work: Path, config: Path, concurrency: int, out: Path) -> None:
    command = [str(PROMPTFOO), "eval", "-c", str(config), "--repeat", "3", "--max-concurrency", str(concurrency),
               "--no-cache", "--no-write", "--no-table", "--no-progress-bar", "-o", str(out)]
    env = {**os.environ, **PROMPTFOO_ENV, "PROMPTFOO_CONFIG_DIR": str(work / "promptfoo-home")}
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:  # stuck: stop node and anything it started
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # promptfoo exits 100 when an assertion failed: the eval ran; anything else is a failure of the run
    assert process.returncode in (0, 100), output[-3000:]
    assert out.exists(), output[-3000:]


def evaluate(model, work: Path, kernels: str) -> tuple[list[Path], Path]:
    """promptfoo at concurrency 1 then 8 against a server with `kernels`; the results files and the record."""
    record = work / "record.jsonl"
    state = build_state(ServeSettings.parse(model=SERVED_NAME, kernels=kernels, max_num_seqs=16), model)
    peaks = []
    outputs = []
    with open(record, "a", encoding="utf-8") as stream, BackgroundServer(build_app(state, None, stream)) as url:
        config = work / "promptfooconfig.yaml"
        config.write_text(config_text(url))
        for concurrency in (1, 8):
            out = work / f"c{concurrency}.json"
            promptfoo_eval(work, config, concurrency, out)
            outputs.append(out)
            peaks.append(int(httpx.get(f"{url}/stats").json()["peak_running_seqs"]))
    # the server's own count: the serial eval ran one sequence a step, the other really batched
    assert peaks[0] == 1 and peaks[1] >= 4, peaks
    return outputs, record


def answers(results: list[Path]) -> dict[tuple[int, int], list[tuple[str, int, bool]]]:
    """(test, prompt) -> (output, concurrency, passed) for every result of every file, as promptfoo wrote them."""
    by_case: dict[tuple[int, int], list[tuple[str, int, bool]]] = defaultdict(list)
    for path in results:
        data = json.loads(path.read_text())
        repeat = data["runtimeOptions"]["repeat"]
        for row in data["results"]["results"]:
            by_case[(row["testIdx"] // repeat, row["promptIdx"])].append(
                (row["response"]["output"], data["runtimeOptions"]["maxConcurrency"], row["success"]))
    return by_case


def case_names(results: Path) -> dict[tuple[int, int], str]:
    data = json.loads(results.read_text())
    repeat = data["runtimeOptions"]["repeat"]
    return {(row["testIdx"] // repeat, row["promptIdx"]): row["testCase"]["description"]
            for row in data["results"]["results"]}


def test_promptfoo_splitk_at_two_concurrencies_is_imported_and_gated(serve_model, tmp_path, capsys) -> None:
    assert PROMPTFOO.exists(), "tools/promptfoo/node_modules is missing: make promptfoo-setup"
    # which requests share a step is the machine's timing: an eval whose batches happened to flip nothing (seen
    # once on a loaded CI box) is run again, each in its own directory and server, 3 times at most
    for attempt in range(3):
        work = tmp_path / f"eval{attempt}"
        work.mkdir()
        results, record = evaluate(serve_model, work, "splitk")
        if any(len({text for text, _, _ in rows}) > 1 for rows in answers(results).values()):
            break
    out, suite = tmp_path / "run", tmp_path / "suite.jsonl"
    code, stdout, stderr = run_cli(capsys, "import", "promptfoo", *results, "--record", record, "--out", out,
                                   "--suite", suite, "--no-html")
    assert code == 0, stdout + stderr
    meta = json.loads((out / "meta.json").read_text())
    cases = pd.read_parquet(out / "cases.parquet").set_index("case_id")
    runs = pd.read_parquet(out / "runs.parquet")
    by_case = answers(results)
    names = case_names(results[0])
    assert any(len({text for text, _, _ in rows}) > 1 for rows in by_case.values())  # split-K did flip some
    assert sorted(cases.index) == sorted(names.values())
    assert meta["import"]["divergence_by"] == {"token": len(names), "text": 0}
    for key, rows in by_case.items():
        name = names[key]
        assert len(rows) == 6
        texts = {text for text, _, _ in rows}
        assert (cases.loc[name, "status"] in ("flaky", "verdict_flaky")) == (len(texts) > 1), name
        case_runs = runs[runs.case_id == name]
        # promptfoo's verdict per concurrency, in order of repeat, is what the run recorded
        for concurrency, composition in ((1, "c1"), (8, "c8")):
            want = [passed for _, c, passed in rows if c == concurrency]
            got = case_runs[case_runs.composition == composition].sort_values("repeat")["passed"].tolist()
            assert sorted(got) == sorted(want), name
        if not pd.isna(cases.loc[name, "first_divergence"]):
            step = int(cases.loc[name, "first_divergence"])
            token_lists = [list(t) for t in case_runs["token_ids"]]
            reference = token_lists[0]
            assert any(len(t) <= step or len(reference) <= step or t[step] != reference[step] for t in token_lists)
            assert all(t[:step] == reference[:step] for t in token_lists)
    # the suite: one case per test x prompt, the JavaScript-judged case ungraded and saying why
    replay = load_suite(suite)
    ungraded = [c for c in replay.cases if c.metadata.get("ungraded")]
    assert [c.id for c in ungraded] == ["judged by code"] and "javascript" in ungraded[0].metadata["ungraded"]
    assert all(c.checks for c in replay.cases if c.id != "judged by code")
    # pass^k: the gate fails exactly the cases promptfoo did not pass in every run
    code, stdout, _ = run_cli(capsys, "gate", out, "--max-flaky-rate", "1", "--max-verdict-flips", "100",
                              "--min-pass-rate", "1", "--junit", tmp_path / "junit.xml")
    not_every = {names[k] for k, rows in by_case.items() if not all(p for _, _, p in rows)}
    assert code == (1 if not_every else 0), stdout
    testcases = ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")
    failing = {tc.get("name") for tc in testcases if tc.find("failure") is not None}
    assert failing == not_every


def test_promptfoo_against_invariant_kernels_gates_clean(serve_model, tmp_path, capsys) -> None:
    assert PROMPTFOO.exists(), "tools/promptfoo/node_modules is missing: make promptfoo-setup"
    results, record = evaluate(serve_model, tmp_path, "invariant")
    for key, rows in answers(results).items():
        assert len({text for text, _, _ in rows}) == 1, key
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(capsys, "import", "promptfoo", *results, "--record", record, "--out", out,
                                   "--no-html")
    assert code == 0, stdout + stderr
    code, stdout, _ = run_cli(capsys, "gate", out)
    assert code == 0, stdout
