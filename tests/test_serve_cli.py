"""`flakecheck serve` from the command line: starts, prints where it listens, answers, stops on Ctrl-C
or SIGTERM with exit 0;
bad options exit 2 before any model is loaded."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from flakecheck import cli


def cli_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["flakecheck", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("stop", "quiet"), [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm-quiet"])
def test_serve_starts_on_a_free_port_answers_and_stops_cleanly(tiny_model_dir: Path, stop: signal.Signals,
                                                               quiet: bool) -> None:
    command = [sys.executable, "-c", "from flakecheck.cli import main; main()", "serve", "--model",
               str(tiny_model_dir), "--port", "0", "--kernels", "invariant", "--dtype", "float32",
               "--max-num-seqs", "4", *(["--quiet"] if quiet else [])]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        banner = lines.get(timeout=300)  # a bound for a stuck start-up (model loading), not a speed goal
        match = re.match(r"flakecheck serve: (http://127\.0\.0\.1:(\d+))/v1 ", banner)
        assert match, banner
        url = match.group(1)
        assert int(match.group(2)) > 0
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["id"] == str(tiny_model_dir)
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "ignore_eos": True}).json()
        assert answer["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(stop)
        code = proc.wait(timeout=60)
    stderr = proc.stderr.read()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    access = [line for line in stderr.splitlines() if re.search(r"Z (GET|POST) /\S* \d{3} ", line)]
    # the access log: one line per request, unless --quiet
    assert [line.split()[1:4] for line in access] == ([] if quiet else [["GET", "/v1/models", "200"],
                                                                        ["POST", "/v1/chat/completions", "200"]])


@pytest.mark.parametrize(("args", "message"), [
    (["--kernels", "fastest"], "kernel policy"),
    (["--port", "70000"], "--port"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--model", "/no/such/dir"], "no such model"),
])
def test_bad_options_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str],
                            message: str) -> None:
    code, err = cli_run(monkeypatch, capsys, "serve", "--port", "0", *args)
    assert code == 2
    assert message in err


def test_a_taken_port_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = cli_run(monkeypatch, capsys, "serve", "--port", str(port))
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err
