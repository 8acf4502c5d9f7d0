"""`flakecheck serve`: load the model, bind the port, print where it listens, serve until Ctrl-C."""

from __future__ import annotations

import ipaddress
import sys

from flakecheck.errors import UserError
from flakecheck.serve.app import build_app
from flakecheck.serve.server import bind_socket, serve_forever, url_of
from flakecheck.serve.state import ServeSettings, build_state


def serve_command(settings: ServeSettings, host: str, port: int, quiet: bool = False) -> None:
    """Serve until stopped; unless `quiet`, an access log line per request on stderr."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be 0..65535 (0: any free port), got {port}")
    sock = bind_socket(host, port)  # first: a taken port fails before minutes of model loading
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
        serve_forever(build_app(state, None if quiet else sys.stderr), sock)
    finally:
        sock.close()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
