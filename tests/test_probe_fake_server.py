"""`flakecheck probe` end to end over HTTP against a fake OpenAI-style server (tests/probe_fakes.py):
every answer shape, the request fields, load that really reaches the server, faults, bad servers,
the API key, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flakecheck.analysis.divergence import first_divergence
from flakecheck.data.rundir import load_run
from flakecheck.errors import UserError
from flakecheck.probe import ProbeConfig, ProbeFailed, probe_suite
from tests.probe_fakes import Behaviour, FaultProxy, Record, ThreadedServer, free_port, make_app
from tests.test_run import run_cli

QUESTIONS = [f"Question {i}: say something about {w}." for i, w in enumerate(
    "rivers stones light paper cities music tables winter forests numbers letters stories bridges markets".split())]


def write_suite(path: Path, chat: bool = True, extra: list[dict] | None = None) -> Path:
    lines = []
    for i, q in enumerate(QUESTIONS):
        case = {"id": f"q{i}", "max_tokens": 24, "target": "river"}
        if chat:
            case["input"] = [{"role": "user", "content": q}]
        else:
            case["prompt"] = q
        lines.append(json.dumps(case))
    lines += [json.dumps(e) for e in extra or []]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def fake():
    """A started fake server: (url, behaviour, record); tests may change the behaviour while it runs."""
    behaviour, record = Behaviour(), Record()
    with ThreadedServer(make_app(behaviour, record)) as server:
        yield server.url, behaviour, record


def probe(suite: Path, url: str, out: Path, **options):
    options.setdefault("concurrency", (1, 8))
    return probe_suite(ProbeConfig(suite, url, out=out, html=False, **options))


def recomputed_first_divergence(runs: pd.DataFrame) -> dict[str, int | None]:
    """Per case, the earliest step where any level's tokens differ from c1's, from runs.parquet alone."""
    result: dict[str, int | None] = {}
    for case_id, rows in runs.groupby("case_id"):
        ref = list(rows[rows.composition == "c1"].iloc[0].token_ids)
        steps = [first_divergence(ref, list(t)) for t in rows.token_ids]
        steps = [s for s in steps if s is not None]
        result[str(case_id)] = min(steps) if steps else None
    return result


def test_probe_under_load_finds_the_divergences_the_tokens_show(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    run = probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run", dtype="bf16")
    assert record.max_in_flight >= 8  # the load reached the server
    assert run.meta["dtype"] == "bfloat16"
    diverged_kinds = run.cases[run.cases.first_divergence.notna()].flip_kind
    assert diverged_kinds.notna().all() and set(diverged_kinds) <= {"tie", "near_tie", "confident"}
    statuses = dict(zip(run.cases.case_id, run.cases.status))
    assert any(s in ("flaky", "verdict_flaky") for s in statuses.values())
    recomputed = recomputed_first_divergence(run.runs)
    for row in run.cases.itertuples():
        reported = None if pd.isna(row.first_divergence) else int(row.first_divergence)
        assert reported == recomputed[row.case_id]
        assert (reported is not None) == (row.status in ("flaky", "verdict_flaky"))
    # ids are the server's own (vLLM-style placeholders), texts came from /detokenize
    assert run.meta["server"]["token_ids"] == "server" and not run.tokens.token.str.startswith("token_id:").any()
    assert run.meta["server"]["version"] == "0.0-fake" and run.meta["server"]["system_fingerprints"] == ["fp_fake"]
    assert run.meta["source"] == "probe" and run.meta["reference"] == "c1"
    assert [c["name"] for c in run.meta["compositions"]] == ["c1", "c8"]
    # every case request: greedy, top-2 logprobs, token ids asked for, its own cache salt, no cached prompt
    case_bodies = [b for b in record.bodies if b.get("logprobs") and b.get("cache_salt") != "flakecheck-check"]
    assert len(case_bodies) == 2 * len(QUESTIONS)
    assert all(b["temperature"] == 0 and b["top_logprobs"] == 2 and b["logprobs"] is True for b in case_bodies)
    assert all(b["return_tokens_as_token_ids"] is True and b["cache_prompt"] is False for b in case_bodies)
    assert len({b["cache_salt"] for b in case_bodies}) == len(case_bodies)
    # the server's text is what was graded and stored
    assert (run.runs.text.str.len() > 0).all()


def test_probe_output_is_identical_through_a_faulty_proxy(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    behaviour.batch_variance = False  # a server whose answers do not depend on load: runs must match exactly
    suite = write_suite(tmp_path / "s.jsonl")
    clean = probe(suite, url, tmp_path / "clean")
    with FaultProxy(url) as proxy:
        faulty = probe(suite, proxy.url, tmp_path / "faulty")
    assert proxy.faults["503"] > 0 and proxy.faults["drop before"] + proxy.faults["drop after"] > 0
    assert faulty.meta["server"]["retried"] > 0
    key = ["case_id", "composition", "repeat"]
    a, b = clean.runs.sort_values(key).reset_index(drop=True), faulty.runs.sort_values(key).reset_index(drop=True)
    assert a.token_ids.map(list).tolist() == b.token_ids.map(list).tolist() and a.text.tolist() == b.text.tolist()
    ta = clean.tokens.sort_values([*key, "step"]).reset_index(drop=True)
    tb = faulty.tokens.sort_values([*key, "step"]).reset_index(drop=True)
    assert ta[["top1_logprob", "top2_logprob"]].equals(tb[["top1_logprob", "top2_logprob"]])
    assert clean.cases.status.tolist() == faulty.cases.status.tolist()


@pytest.mark.parametrize("shape, chat", [("llamacpp", False), ("text", True), ("text", False), ("serve", True)])
def test_every_answer_shape_gives_the_same_tokens(fake, tmp_path: Path, shape: str, chat: bool) -> None:
    url, behaviour, _ = fake
    behaviour.batch_variance = False
    suite = write_suite(tmp_path / "s.jsonl", chat=chat)
    reference = probe(suite, url, tmp_path / "vllm", concurrency=(1,))
    behaviour.shape = shape
    other = probe(suite, url, tmp_path / shape, concurrency=(1,))
    assert other.meta["server"]["token_ids"] == ("interned" if shape == "text" else "server")
    assert reference.runs.text.tolist() == other.runs.text.tolist()
    assert reference.runs.n_tokens.tolist() == other.runs.n_tokens.tolist()
    assert reference.tokens.token.tolist() == other.tokens.token.tolist()
    assert reference.tokens.top2_token.tolist() == other.tokens.top2_token.tolist()


def test_cases_follow_the_input_convention_and_api_overrides_it(fake, tmp_path: Path, capfd) -> None:
    url, _, record = fake
    suite = tmp_path / "mixed.jsonl"
    suite.write_text("\n".join(json.dumps(c) for c in [
        {"id": "text", "input": "Say hello.", "max_tokens": 4},
        {"id": "raw", "prompt": "Once upon a time", "max_tokens": 4},
        {"id": "talk", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "max_tokens": 4},
    ]) + "\n")
    run = probe(suite, url, tmp_path / "auto", concurrency=(1,))
    assert run.meta["server"]["api"] == {"chat": 2, "completions": 1}
    sent = {b.get("cache_salt", "").rsplit("-", 1)[-1]: b for b in record.bodies}
    assert sent["text"]["messages"] == [{"role": "user", "content": "Say hello."}]
    assert sent["raw"]["prompt"] == "Once upon a time" and sent["talk"]["messages"][0]["role"] == "system"
    run = probe(suite, url, tmp_path / "chat", concurrency=(1,), api="chat")
    assert run.meta["server"]["api"] == {"chat": 3, "completions": 0}
    # a conversation cannot be sent as raw text: exit 2 naming the file and line, nothing written
    code, output = run_cli(["probe", str(suite), "--endpoint", url, "--api", "completions", "--out",
                            str(tmp_path / "raw")], capfd)
    assert code == 2 and "mixed.jsonl:3" in output and not (tmp_path / "raw").exists()


def test_a_server_that_rejects_token_ids_is_probed_by_text(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    behaviour.reject_fields = ("return_tokens_as_token_ids",)
    run = probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run", concurrency=(1,))
    assert run.meta["server"]["token_ids"] == "interned" and not run.meta["server"]["return_tokens_as_token_ids"]
    assert len(run.runs) == len(QUESTIONS)


def test_isolation_none_and_the_prefix_level_send_what_they_say(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    suite = write_suite(tmp_path / "s.jsonl")
    probe(suite, url, tmp_path / "none", concurrency=(1,), isolation="none")
    assert not any("cache_salt" in b or "cache_prompt" in b for b in record.bodies)
    record.bodies.clear()
    run = probe(suite, url, tmp_path / "prefix", concurrency=(1,), prefix=True)
    assert [c["name"] for c in run.meta["compositions"]] == ["c1", "prefix"]
    prefix = [b for b in record.bodies if "-prefix-" in b.get("cache_salt", "")]
    assert len(prefix) == 2 * len(QUESTIONS)
    for warm, case in zip(prefix[::2], prefix[1::2]):  # serial: each case right after its warm-up
        assert warm["max_tokens"] == 1 and "logprobs" not in warm and case["logprobs"] is True
        assert warm["cache_salt"] == case["cache_salt"] and warm["cache_prompt"] is case["cache_prompt"] is True
        assert warm["messages"] == case["messages"]


def test_repeats_probe_every_level_again_in_another_order(fake, tmp_path: Path) -> None:
    url, _, record = fake
    run = probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run", repeat=2)
    assert sorted(set(zip(run.runs.composition, run.runs.repeat))) == [("c1", 0), ("c1", 1), ("c8", 0), ("c8", 1)]
    assert set(run.meta["server"]["levels"]) == {"c1", "c8", "c1 #1", "c8 #1"}
    first, second = ([b["cache_salt"].rsplit("-", 1)[-1] for b in record.bodies
                      if f"-c8-{r}-" in b.get("cache_salt", "")] for r in (0, 1))
    assert sorted(first) == sorted(second) and first != second  # the same cases, sent in another order


def test_fillers_keep_more_requests_in_flight(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    run = probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run", concurrency=(1, 4), fillers=6)
    assert record.max_in_flight >= 4 + 6 - 1
    fillers = [b for b in record.bodies if "-filler-" in b.get("cache_salt", "")]
    assert fillers and not any("logprobs" in b for b in fillers)
    assert run.meta["server"]["levels"]["c4+f6"]["fillers_sent"] >= 6


def test_failed_fillers_lose_no_result_and_are_reported(fake, tmp_path: Path, capfd) -> None:
    url, behaviour, record = fake
    behaviour.fail_salt = "-filler-"  # every filler gets HTTP 500; the cases are answered
    out = tmp_path / "run"
    code, output = run_cli(["probe", str(write_suite(tmp_path / "s.jsonl")), "--endpoint", url, "--out", str(out),
                            "--concurrency", "1,2", "--fillers", "2", "--retries", "0", "--no-html"], capfd)
    assert code == 0
    level = load_run(out).meta["server"]["levels"]["c2+f2"]
    assert 0 < level["fillers_failed"] <= level["fillers_sent"]  # the last may be cancelled in flight
    assert level["filler_errors"] and all("HTTP 500" in e for e in level["filler_errors"])
    assert f"level c2+f2: {level['fillers_failed']} of {level['fillers_sent']} filler requests failed" in output
    assert "level c1" not in output  # the reference level has no fillers


def test_a_request_that_fails_for_good_stops_the_probe_and_resume_continues(fake, tmp_path: Path) -> None:
    url, behaviour, record = fake
    out = tmp_path / "run"
    config = ProbeConfig(write_suite(tmp_path / "s.jsonl"), url, out=out, html=False, concurrency=(1, 8), retries=1)
    behaviour.fail_salt = "-c8-"  # level c8's requests get HTTP 500, retried once, then given up
    with pytest.raises(ProbeFailed, match=r"level c8 \(repeat 0\): \d+ request\(s\) failed — case 'q\d+': HTTP 500"
                       ) as info:
        probe_suite(config)
    assert "--resume" in str(info.value) and "1 of 2 load levels" in str(info.value)
    assert not (out / "runs.parquet").exists() and (out / "partial" / "c1.r0.parquet").is_file()

    behaviour.fail_salt = None
    record.bodies.clear()
    run = probe_suite(config, resume=True)
    assert not any("-c1-" in b.get("cache_salt", "") for b in record.bodies)  # c1 was not probed again
    assert len(run.runs) == 2 * len(QUESTIONS) and not (out / "partial").exists()


def test_an_answer_that_cannot_be_read_stops_the_level_with_its_case_named(fake, tmp_path: Path) -> None:
    url, behaviour, _ = fake
    behaviour.shape = "mixed"
    with pytest.raises(ProbeFailed, match=r"case 'q\d+': unusable answer: the server reported token ids for some"):
        probe(write_suite(tmp_path / "s.jsonl"), url, tmp_path / "run", concurrency=(1,))


@pytest.mark.parametrize("setup, needle", [
    (lambda b: setattr(b, "logprobs", False), "no logprobs"),
    (lambda b: setattr(b, "not_openai", True), "not an OpenAI-compatible server"),
    (lambda b: setattr(b, "reject_fields", ("cache_salt",)), "--isolation none"),
    (None, "unknown model 'nope'"),
    ("--dtype", "--dtype: unknown dtype 'int3'"),
])
def test_bad_servers_exit_2_and_write_nothing(fake, tmp_path: Path, capfd, setup, needle: str) -> None:
    url, behaviour, _ = fake
    if callable(setup):
        setup(behaviour)
    out = tmp_path / "run"
    argv = ["probe", str(write_suite(tmp_path / "s.jsonl")), "--endpoint", url, "--out", str(out), "--quiet"]
    if setup is None:
        argv += ["--model", "nope"]
    if setup == "--dtype":
        argv += ["--dtype", "int3"]
    code, output = run_cli(argv, capfd)
    assert code == 2 and needle in output and not out.exists()


def test_a_refused_connection_exits_2_and_writes_nothing(tmp_path: Path, capfd) -> None:
    out = tmp_path / "run"
    code, output = run_cli(["probe", str(write_suite(tmp_path / "s.jsonl")), "--endpoint",
                            f"http://127.0.0.1:{free_port()}", "--out", str(out)], capfd)
    assert code == 2 and "cannot reach" in output and "Traceback" not in output and not out.exists()


def test_the_api_key_reaches_the_server_and_nowhere_else(fake, tmp_path: Path, capfd, monkeypatch) -> None:
    url, behaviour, record = fake
    key = "sk-flakecheck-test-7f3a9c1e5b"
    monkeypatch.setenv("PROBE_TEST_KEY", key)
    out = tmp_path / "run"
    code, output = run_cli(["probe", str(write_suite(tmp_path / "s.jsonl")), "--endpoint", url, "--out", str(out),
                            "--api-key-env", "PROBE_TEST_KEY", "--concurrency", "1,4"], capfd)
    assert code == 0 and record.authorizations[f"Bearer {key}"] > 0
    assert key not in output and "PROBE_TEST_KEY" in json.loads((out / "meta.json").read_text())["command"]
    for path in out.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    # a missing variable is a usage error, named by the variable, not by any value
    monkeypatch.delenv("PROBE_TEST_KEY")
    code, output = run_cli(["probe", str(tmp_path / "s.jsonl"), "--endpoint", url, "--out", str(tmp_path / "x"),
                            "--api-key-env", "PROBE_TEST_KEY"], capfd)
    assert code == 2 and "PROBE_TEST_KEY" in output and not (tmp_path / "x").exists()


def test_report_and_gate_read_a_probe_run(fake, tmp_path: Path, capfd) -> None:
    url, _, _ = fake
    out = tmp_path / "run"
    code, output = run_cli(["probe", str(write_suite(tmp_path / "s.jsonl")), "--endpoint", url, "--out", str(out),
                            "--concurrency", "1,8"], capfd)
    assert code == 0 and "probed" in output and (out / "report.html").is_file()
    run = load_run(out)
    diverged = run.cases.status.isin(["flaky", "verdict_flaky"]).sum()
    code, output = run_cli(["gate", str(out)], capfd)
    assert code == (1 if diverged else 0)
    code, output = run_cli(["report", str(out), "--format", "json"], capfd)
    assert code == 0 and json.loads(output)


def test_ctrl_c_keeps_the_finished_levels_and_resume_finishes(fake, tmp_path: Path, monkeypatch) -> None:
    from flakecheck.run.pipeline import RunInterrupted
    from flakecheck.run.progress import ReplayProgress

    url, _, record = fake
    out = tmp_path / "run"
    config = ProbeConfig(write_suite(tmp_path / "s.jsonl"), url, out=out, html=False, concurrency=(1, 8))
    original = ReplayProgress.case_done

    def interrupt_in_c8(self, trace) -> None:
        if trace.composition == "c8":
            raise KeyboardInterrupt
        original(self, trace)

    monkeypatch.setattr(ReplayProgress, "case_done", interrupt_in_c8)
    with pytest.raises(RunInterrupted, match="1 of 2 load levels") as info:
        probe_suite(config)
    assert f"--out {out}" in str(info.value) and str(info.value).endswith("--resume")
    assert (out / "partial" / "c1.r0.parquet").is_file() and not (out / "partial" / "c8.r0.parquet").exists()
    monkeypatch.setattr(ReplayProgress, "case_done", original)
    with pytest.raises(UserError, match="cannot resume, the run's settings differ in: max_tokens"):
        probe_suite(config.with_changes(max_tokens=5), resume=True)  # other traces: refused
    record.bodies.clear()
    run = probe_suite(config, resume=True)
    assert not any("-c1-" in b.get("cache_salt", "") for b in record.bodies)
    assert len(run.runs) == 2 * len(QUESTIONS)


def test_tls_certificates_are_verified(tmp_path: Path, capfd, monkeypatch) -> None:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    suite = write_suite(tmp_path / "s.jsonl")
    with ThreadedServer(make_app(Behaviour(), Record()), tls=(str(cert), str(key))) as server:
        code, output = run_cli(["probe", str(suite), "--endpoint", server.url, "--out", str(tmp_path / "no"),
                                "--concurrency", "1"], capfd)
        assert code == 2 and "CERTIFICATE_VERIFY_FAILED" in output and not (tmp_path / "no").exists()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # a private CA is trusted the standard way
        code, output = run_cli(["probe", str(suite), "--endpoint", server.url, "--out", str(tmp_path / "yes"),
                                "--concurrency", "1", "--quiet"], capfd)
        assert code == 0 and (tmp_path / "yes" / "cases.parquet").is_file()
