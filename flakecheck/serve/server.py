"""uvicorn around the app: in the foreground for the CLI, or in a thread for tests and scripts.

The socket is bound before uvicorn starts, so port 0 (any free port) is known and can be printed
the moment the server is reachable.
"""

from __future__ import annotations

import signal
import socket
import threading
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from flakecheck.errors import UserError


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: FastAPI, log_level: str) -> uvicorn.Server:
    # One worker, one process: the engine loop lives in this process and owns the model.
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5))


def serve_forever(app: FastAPI, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve until Ctrl-C or SIGTERM, shut down gracefully (the lifespan stops the engine loop), return.

    uvicorn re-raises the stopping signal once it has shut down; a no-op handler installed around it
    receives that, so a requested stop ends the process with exit code 0."""
    stopping = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in stopping}
    try:
        _server(app, log_level).run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class BackgroundServer:
    """`with BackgroundServer(app) as url:` the real server on a free loopback port, in a thread."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.sock = bind_socket(host, port)
        self.url = url_of(self.sock)
        self.server = _server(app, log_level)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:  # uvicorn sets this once the lifespan started the engine loop
            if not self.thread.is_alive():
                raise RuntimeError("the server thread stopped during start-up")
            self.thread.join(0.01)
        return self.url

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()
