"""`flakecheck serve`: load the model, bind the port, print where it listens, serve until Ctrl-C."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import sys
from pathlib import Path
from typing import TextIO

from flakecheck.errors import UserError
from flakecheck.serve.app import build_app
from flakecheck.serve.server import bind_socket, serve_forever, url_of
from flakecheck.serve.state import ServeSettings, build_state


def serve_command(settings: ServeSettings, host: str, port: int, quiet: bool = False,
                  record: Path | None = None) -> None:
    """Serve until stopped; unless `quiet`, an access log line per request on stderr; with `record`, each
    answer's tokens and top-2 logprobs appended there (flakecheck.serve.response_record)."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be 0..65535 (0: any free port), got {port}")
    sock = bind_socket(host, port)  # first: a taken port fails before minutes of model loading
    with contextlib.ExitStack() as files:
        try:
            record_file = files.enter_context(open(record, "a", encoding="utf-8")) if record is not None else None
        except OSError as exc:
            sock.close()
            raise UserError(f"--record-responses {record}: cannot open ({exc.strerror or exc})") from exc
        _serve(settings, host, sock, quiet, record_file)


def _serve(settings: ServeSettings, host: str, sock: socket.socket, quiet: bool, record: TextIO | None) -> None:
    try:
        state = build_state(settings)
        if not _is_loopback(host):
            print(f"warning: listening on {host}, reachable from other machines; the API has no authentication",
                  file=sys.stderr)
        spec = state.spec
        print(f"flakecheck serve: {url_of(sock)}/v1 (model {state.model_id}, kernels {spec.policy.name}, "
              f"dtype {spec.dtype}, profile {spec.profile}, max-num-seqs {settings.max_num_seqs}, "
              f"fingerprint {state.fingerprint})", flush=True)
        print(f"machine: {state.spec.verification.summary()}", flush=True)
        serve_forever(build_app(state, None if quiet else sys.stderr, record), sock)
    finally:
        sock.close()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
